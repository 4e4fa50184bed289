// The instruction set the device's own loops run on: fusion's exact
// arithmetic and register chains, the sigmoid they compute as ATen does, the
// device's own tanh (TORCHNEURON_DEVICE_TANH=1), non-temporal stores and the NKI emulator's bfloat16
// rounding. Each level's loops live in their own
// translation unit, compiled for that level alone (isa_avx512.cpp,
// isa_avx2.cpp, isa_portable.cpp; the loops themselves are written once, in
// simd_loops.h). One level is chosen per process, the first time it is
// asked for: ATen's CPU capability (which honours ATEN_CPU_CAPABILITY, so a
// user can force a lower level), capped by what the host supports. It must be
// ATen's: sigmoid is reproduced from the vector kernel ATen runs at that level.
#pragma once

#include <cstddef>
#include <cstdint>

namespace torchneuron {

struct ExactArithmetic;
struct SliceOperand;
struct ChainProgram;

namespace isa {

struct Kernels {
  const char* name;  // "avx512", "avx2", "portable"
  // exact_arithmetic.h's run_exact, and run_chain for float and double.
  bool (*run_exact)(const ExactArithmetic& op, char* out, SliceOperand self, SliceOperand other, int64_t n);
  int64_t (*run_chain)(const ChainProgram& program, int64_t slice, int64_t begin, int64_t n);
  int64_t chain_bytes;  // what a chunk of run_chain holds in registers
  // The device's own float32 tanh (tanh.h, TORCHNEURON_DEVICE_TANH=1): the
  // same bits at every level.
  void (*tanh_float)(float* out, const float* x, int64_t n);
  // ATen's sigmoid kernel at this level, element for element; `sigmoid_ready`
  // says whether the exp it needs is there (a weak library symbol) and, where
  // it is written inline, equals the library's on a sweep of inputs.
  void (*sigmoid_float)(float* out, const float* x, int64_t n);
  void (*sigmoid_double)(double* out, const double* x, int64_t n);
  bool (*sigmoid_ready)(bool is_double);
  // exact_arithmetic.h's stream_copy and end_streaming.
  void (*stream_copy)(char* to, const char* from, size_t bytes);
  void (*end_streaming)();
  // nki_host.h's round_to_bf16 (the same bits at every level).
  void (*round_to_bf16)(const float* src, uint16_t* dst, int64_t n);
};

// The level this process runs (chosen once).
const Kernels& kernels();
// The highest level this host supports, whatever was chosen.
const char* host_level();

extern const Kernels kPortable;
#if defined(__x86_64__)
extern const Kernels kAvx2, kAvx512;
#endif

} // namespace isa
} // namespace torchneuron
