// The NKI emulator's (torchneuron/nki/) inner loops that NumPy does slowly:
//
// * The Tensor Engine on bfloat16 tiles: stationary.T @ moving with float32
//   products and float32 accumulation, on the host's matrix unit (AMX, in
//   nki_gemm_amx.cpp) where it has one. Products of bfloat16 values are exact
//   in float32 and are summed in float32, as the PE array does: each element's
//   sum starts at zero and adds the pairs of k in ascending order (so a launch
//   gives the same bits on every call and thread); AMX treats subnormal inputs
//   and sums as zero.
// * Rounding float32 engine results to bfloat16 as ml_dtypes' cast does
//   (nearest, ties to even; NaN becomes the quiet NaN of its sign).
#pragma once

#include <cstdint>
#include <vector>

namespace torchneuron::nki_host {

// Whether the host has the bfloat16 matrix unit (AMX, usable by this process)
// and runs ATen's AVX512 capability (ATEN_CPU_CAPABILITY=avx2 forces it off);
// without one the emulator keeps its float32 BLAS GEMM.
bool bf16_gemm_available();

// A row-major 2-D array: element (i, j) at data[i * row_stride + j].
template <typename T>
struct Matrix {
  T* data;
  int64_t rows, cols, row_stride;
};

// An operand in the matrix unit's layout: pairs of bfloat16 of rows k and
// k + 1, in 16 x 16 tiles of pairs, zero-padded. Staged once, it can be
// multiplied many times (the emulator stages a region of a kernel argument
// once per launch when the launch writes no argument). Owns its storage; it
// does not follow later writes to the array it was staged from.
struct StagedOperand {
  std::vector<uint32_t> pairs;
  int64_t rows = 0, cols = 0;  // K x M (stationary) or K x N (moving), as given
  bool stationary = false;
};

// `x` staged as a stationary (K x M) or moving (K x N) operand into `into`:
// K even (the matrix unit takes bfloat16 pairs) and at most 128, M at most
// 128, N at most 512 (the Tensor Engine's tile limits), else an error.
void stage(Matrix<const uint16_t> x, bool stationary, StagedOperand& into);

// sum[m][n] = sum over k of stationary[k][m] * moving[k][n]; `out` (M x N)
// becomes the sum, or with `accumulate` out + sum (the PSUM adder: the sum is
// rounded to float32 before it is added). The caller owns the operands and
// `out`.
void bf16_gemm(const StagedOperand& stationary, const StagedOperand& moving, Matrix<float> out, bool accumulate);

// One product of a chain; the chain does not own the operands.
struct GemmPair {
  const StagedOperand* stationary;
  const StagedOperand* moving;
};

// bf16_gemm of each pair in turn into the same `out` (every pair M x N, K its
// own), the first with `accumulate`, the rest accumulating: the same sums
// added in the same order as one bf16_gemm per pair, with `out` read and
// written once per output block instead of once per pair. Large chains run
// on two threads of the intra-op pool, each owning whole output columns.
void bf16_gemm_chain(const std::vector<GemmPair>& pairs, Matrix<float> out, bool accumulate);

// dst[i] = src[i] rounded to bfloat16 (its bits), for i < n.
void round_to_bf16(const float* src, uint16_t* dst, int64_t n);

} // namespace torchneuron::nki_host
