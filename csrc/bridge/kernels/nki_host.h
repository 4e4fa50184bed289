// The NKI emulator's (torchneuron/nki/) inner loops that NumPy does slowly:
//
// * The Tensor Engine on bfloat16 tiles: stationary.T @ moving with float32
//   products and float32 accumulation, on the host's matrix unit (AMX,
//   through ATen's oneDNN micro-kernel) where it has one. Products of
//   bfloat16 values are exact in float32 and the micro-kernel sums them in
//   float32, as the PE array does; the order of the sum is the micro-kernel's
//   own (fixed for a tile shape, so a launch gives the same bits on every call
//   and thread), and AMX treats subnormal inputs and sums as zero.
// * Rounding float32 engine results to bfloat16 as ml_dtypes' cast does
//   (nearest, ties to even; NaN becomes the quiet NaN of its sign).
#pragma once

#include <cstdint>

namespace torchneuron::nki_host {

// Whether the host has the bfloat16 matrix unit (AMX) and ATen's micro-kernel
// for it; without one the emulator keeps its float32 BLAS GEMM.
bool bf16_gemm_available();

// A row-major 2-D array: element (i, j) at data[i * row_stride + j].
template <typename T>
struct Matrix {
  T* data;
  int64_t rows, cols, row_stride;
};

// sum[m][n] = sum over k of stationary[k][m] * moving[k][n]; `out` becomes the
// sum, or with `accumulate` out + sum (the PSUM adder: the sum is rounded to
// float32 before it is added). stationary is K x M, moving K x N, out M x N;
// K even (the matrix unit takes bfloat16 pairs) and at most 128, M at most
// 128, N at most 512 (the Tensor Engine's tile limits), else an error. Runs on
// the calling thread; the caller owns the arrays.
void bf16_gemm(Matrix<const uint16_t> stationary, Matrix<const uint16_t> moving, Matrix<float> out, bool accumulate);

// dst[i] = src[i] rounded to bfloat16 (its bits), for i < n.
void round_to_bf16(const float* src, uint16_t* dst, int64_t n);

} // namespace torchneuron::nki_host
