#include "nki_host.h"

#include "isa.h"

#include <c10/util/Exception.h>

#include <cstring>

namespace torchneuron::nki_host {

#if defined(__x86_64__)
// nki_gemm_amx.cpp
bool amx_gemm_ready();
void amx_stage(Matrix<const uint16_t> x, bool stationary, StagedOperand& into);
void amx_gemm_chain(const GemmPair* pairs, int64_t n_pairs, Matrix<float> out, bool accumulate);
#endif

bool bf16_gemm_available() {
#if defined(__x86_64__)
  static const bool available = std::strcmp(isa::kernels().name, "avx512") == 0 && amx_gemm_ready();
  return available;
#else
  return false;
#endif
}

void stage(Matrix<const uint16_t> x, bool stationary, StagedOperand& into) {
  TORCH_CHECK(bf16_gemm_available(), "nki_host::stage: the host has no bfloat16 matrix unit");
  TORCH_CHECK(x.rows > 0 && x.rows % 2 == 0 && x.rows <= 128 && x.cols > 0 && x.cols <= (stationary ? 128 : 512),
              "nki_host::stage: a ", x.rows, " x ", x.cols, (stationary ? " stationary" : " moving"),
              " tile is outside the matrix unit's shapes");
#if defined(__x86_64__)
  amx_stage(x, stationary, into);
#endif
}

namespace {
void check_shapes(int64_t k, int64_t m, int64_t moving_k, int64_t n, const Matrix<float>& out) {
  TORCH_CHECK(moving_k == k && out.rows == m && out.cols == n, "nki_host::bf16_gemm: stationary ", k, " x ", m,
              ", moving ", moving_k, " x ", n, " and out ", out.rows, " x ", out.cols, " do not match");
}
} // namespace

void bf16_gemm(const StagedOperand& stationary, const StagedOperand& moving, Matrix<float> out, bool accumulate) {
  bf16_gemm_chain({GemmPair{&stationary, &moving}}, out, accumulate);
}

void bf16_gemm_chain(const std::vector<GemmPair>& pairs, Matrix<float> out, bool accumulate) {
  TORCH_CHECK(!pairs.empty(), "nki_host::bf16_gemm_chain: no products");
  for (const auto& [s, m] : pairs) {
    TORCH_CHECK(s->stationary && !m->stationary, "nki_host::bf16_gemm: operands staged in the wrong roles");
    check_shapes(s->rows, s->cols, m->rows, m->cols, out);
  }
#if defined(__x86_64__)
  amx_gemm_chain(pairs.data(), static_cast<int64_t>(pairs.size()), out, accumulate);
#endif
}

void round_to_bf16(const float* src, uint16_t* dst, int64_t n) { isa::kernels().round_to_bf16(src, dst, n); }

} // namespace torchneuron::nki_host
