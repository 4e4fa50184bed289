// Unary functions that fusion computes in its own slice loops, exactly as
// unfused execution on the device computes them, so that they match it bit
// for bit:
// * float tanh where TORCHNEURON_DEVICE_TANH=1 selects the device's own
//   (tanh.h): that function, which its unfused kernel computes
//   (device_ops.h). Otherwise tanh is the CPU's, MKL's like exp (below).
// * sigmoid: ATen's vector kernel is 1 / (exp(-x) + 1), two vectors at a
//   time, with SLEEF's exp on ATen's AVX512 and AVX2 paths and libm's
//   elsewhere; the remainder of each call runs the scalar form with libm's
//   exp. Reproduced at each instruction-set level by that level's loops
//   (isa.h).
// * tanh, exp, log, sqrt, sin, cos, erf, ...: ATen hands them to
//   MKL's vector math (VML), which computes each element on its own, however
//   calls are cut.
// The last two rely on how this build of ATen writes its kernels, so each
// function is checked once per process against ATen itself, on values that
// take every path (remainders, NaN payloads, infinities, subnormals, huge
// values); one that does not match is left to ATen's kernel.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace torchneuron::vector_math {

struct Unary;

// The function computing ATen's operator `op` (a base name: "tanh") for
// `dtype` as unfused execution on the device does in this process, or nullptr.
const Unary* as_unfused(const std::string& op, c10::ScalarType dtype);

// Whether `fn` is sigmoid, which chains (exact_chain.cpp) compute vector by
// vector as 1 / (exp(-x) + 1) with SLEEF's exp, as ATen's vector loop does.
bool is_sigmoid(const Unary& fn);
// Whether `fn` is the device's own tanh for `dtype` (selected by
// TORCHNEURON_DEVICE_TANH=1), which chains compute vector by vector.
bool is_own_tanh(const Unary& fn, c10::ScalarType dtype);

// out[i] = fn(x[i]) for i < n. `n` must be where ATen's own call would end
// (a thread's range) or a multiple of its vector step (fusion's slices are).
void run(const Unary& fn, c10::ScalarType dtype, char* out, const char* x, int64_t n);

// Sets MKL's thread count for the calling thread, as at::set_num_threads does
// for its own; returns the previous count, or -1 where MKL is absent.
int set_mkl_threads_of_this_thread(int n);

// While alive, MKL runs the calling thread's calls on that thread alone.
// Fusion calls VML once per slice (1024 elements) from inside its own
// parallel region. Once torch.set_num_threads has run, which turns MKL's
// dynamic adjustment off for the whole process, MKL weighs threads for each
// such call, which costs more than a slice's work. ATen's own calls, one per
// thread range, barely notice. Results do not change: VML computes each element on
// its own.
class MklOnThisThread {
 public:
  MklOnThisThread();
  ~MklOnThisThread();
  MklOnThisThread(const MklOnThisThread&) = delete;
  MklOnThisThread& operator=(const MklOnThisThread&) = delete;

 private:
  int previous_ = -1;  // the thread's own setting before (0: none), or -1: no MKL
};

} // namespace torchneuron::vector_math
