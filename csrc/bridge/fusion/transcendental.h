// Sigmoid and tanh over a slice, computed by the same math-library calls, in
// the same order, as ATen's CPU kernels, so that a fused group can run them in
// its own slice loops and still match unfused execution bit for bit:
// * sigmoid: ATen's vector kernel is 1 / (1 + exp(-x)) with SLEEF's exp, two
//   vectors at a time; the remainder of each call runs the scalar form with
//   libm's exp. Reproduced on ATen's AVX512 path only.
// * tanh: ATen hands it to MKL's vector math (VML), which computes each
//   element on its own, however the calls are cut.
// Both rely on how this build of ATen writes its kernels, so `matches_aten`
// checks them once per process against ATen itself, on values that exercise
// every path (remainders, NaN payloads, infinities, subnormals), and a member
// that does not match stays with ATen's kernel.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace torchneuron::transcendental {

enum class Fn : uint8_t { Sigmoid, Tanh };

bool matches_aten(Fn fn, c10::ScalarType dtype);

// out[i] = fn(x[i]) for i < n. `n` must be where ATen's own call would end
// (a thread's range) or a multiple of its vector step (fusion's slices are).
void run(Fn fn, c10::ScalarType dtype, char* out, const char* x, int64_t n);

} // namespace torchneuron::transcendental
