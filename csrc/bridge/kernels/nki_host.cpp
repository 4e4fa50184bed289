#include "nki_host.h"

#include <ATen/native/CPUBlas.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace torchneuron::nki_host {

bool bf16_gemm_available() {
  static const bool available = at::native::cpublas::could_pack(at::kBFloat16);
  return available;
}

void bf16_gemm(Matrix<const uint16_t> stationary, Matrix<const uint16_t> moving, Matrix<float> out, bool accumulate) {
  const int64_t K = stationary.rows, M = stationary.cols, N = moving.cols;
  TORCH_CHECK(bf16_gemm_available(), "nki_host::bf16_gemm: the host has no bfloat16 matrix unit");
  TORCH_CHECK(moving.rows == K && out.rows == M && out.cols == N, "nki_host::bf16_gemm: stationary ", K, " x ", M,
              ", moving ", moving.rows, " x ", N, " and out ", out.rows, " x ", out.cols, " do not match");
  TORCH_CHECK(K > 0 && K % 2 == 0 && K <= 128 && M > 0 && M <= 128 && N > 0 && N <= 512,
              "nki_host::bf16_gemm: tile of ", K, " x ", M, " x ", N, " outside the matrix unit's shapes");
  // The micro-kernel reads A as M x K rows and B in the matrix unit's pair
  // layout, in blocks of at most 64 columns (its widest packed block). Staging
  // buffers are per thread: launches run on several threads.
  constexpr int64_t kBlock = 64, kTile = 16;
  thread_local std::vector<c10::BFloat16> a, b;
  a.resize(M * K);
  b.resize(K * kBlock);
  const auto* s = reinterpret_cast<const c10::BFloat16*>(stationary.data);
  for (int64_t k0 = 0; k0 < K; k0 += kTile)  // transposed in tiles that stay in L1
    for (int64_t m0 = 0; m0 < M; m0 += kTile)
      for (int64_t k = k0; k < std::min(k0 + kTile, K); ++k)
        for (int64_t m = m0; m < std::min(m0 + kTile, M); ++m) a[m * K + k] = s[k * stationary.row_stride + m];
  // With `accumulate`, each block's sum lands in a small scratch (it stays in
  // cache) and is added to `out` before the next block.
  thread_local std::vector<float> sum;
  if (accumulate) sum.resize(M * kBlock);
  for (int64_t n0 = 0; n0 < N; n0 += kBlock) {
    const int64_t n = std::min(kBlock, N - n0);
    const int64_t ld = (n + 15) / 16 * 16;
    at::native::cpublas::pack(K, n, moving.row_stride, ld, at::kBFloat16, at::kBFloat16, moving.data + n0,
                              b.data());
    float* c = accumulate ? sum.data() : out.data + n0;
    const int64_t ldc = accumulate ? kBlock : out.row_stride;
    at::native::cpublas::brgemm(M, n, K, K, ld, ldc, /*add_C=*/false, a.data(), b.data(), c, /*is_vnni=*/true);
    if (accumulate)
      for (int64_t m = 0; m < M; ++m) {
        float* o = out.data + m * out.row_stride + n0;
        const float* r = sum.data() + m * kBlock;
#pragma omp simd  // one add per element (the PSUM adder), in vectors: o and r never overlap
        for (int64_t j = 0; j < n; ++j) o[j] += r[j];
      }
  }
  // The tile configuration is per thread; other kernels on this thread set their own.
  at::native::cpublas::brgemm_release(true);
}

void round_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &src[i], sizeof u);
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    dst[i] = static_cast<uint16_t>(nan ? ((u >> 16) & 0x8000u) | 0x7fc0u : rounded);
  }
}

} // namespace torchneuron::nki_host
