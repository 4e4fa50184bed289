#include "transcendental.h"

#include <ATen/Config.h>
#include <ATen/Version.h>  // get_cpu_capability: which of ATen's kernels run
#include <ATen/ops/empty.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/tanh.h>

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

// The libraries ATen's kernels call, linked into libtorch_cpu. Weak: a build
// without them leaves these members to ATen instead of failing to load.
#pragma GCC push_options
#pragma GCC target("avx512f")
extern "C" {
__m512 Sleef_expf16_u10(__m512) __attribute__((weak));
__m512d Sleef_expd8_u10(__m512d) __attribute__((weak));
}
#pragma GCC pop_options
extern "C" {
// MKL_INT is 32 or 64 bits by the interface; a 64-bit count serves both.
void vmsTanh(int64_t n, const float* a, float* r, int64_t mode) __attribute__((weak));
void vmdTanh(int64_t n, const double* a, double* r, int64_t mode) __attribute__((weak));
}

namespace torchneuron::transcendental {
namespace {

// The accuracy and error modes ATen's VML wrappers pass: high accuracy,
// denormals kept, errors ignored.
constexpr int64_t kVmlMode = 0x2 | 0x140000 | 0x100;

template <typename T>
T sigmoid_scalar(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// ATen's vectorized loop: pairs of vectors, then the remainder in scalar code.
__attribute__((target("avx512f"))) void sigmoid_avx512(float* out, const float* x, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512i sign = _mm512_set1_epi32(int32_t(0x80000000u));
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int64_t k = i; k < i + 32; k += 16) {
      const __m512 neg = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_loadu_ps(x + k)), sign));
      _mm512_storeu_ps(out + k, _mm512_div_ps(one, _mm512_add_ps(Sleef_expf16_u10(neg), one)));
    }
  for (; i < n; ++i) out[i] = sigmoid_scalar(x[i]);
}

__attribute__((target("avx512f"))) void sigmoid_avx512(double* out, const double* x, int64_t n) {
  const __m512d one = _mm512_set1_pd(1.0);
  const __m512i sign = _mm512_set1_epi64(int64_t(0x8000000000000000ull));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int64_t k = i; k < i + 16; k += 8) {
      const __m512d neg = _mm512_castsi512_pd(_mm512_xor_si512(_mm512_castpd_si512(_mm512_loadu_pd(x + k)), sign));
      _mm512_storeu_pd(out + k, _mm512_div_pd(one, _mm512_add_pd(Sleef_expd8_u10(neg), one)));
    }
  for (; i < n; ++i) out[i] = sigmoid_scalar(x[i]);
}

bool available(Fn fn, c10::ScalarType dtype) {
  const bool f32 = dtype == at::kFloat;
  if (fn == Fn::Tanh) return AT_MKL_ENABLED() && (f32 ? vmsTanh != nullptr : vmdTanh != nullptr);
  return at::get_cpu_capability() == "AVX512" &&
         (f32 ? Sleef_expf16_u10 != nullptr : Sleef_expd8_u10 != nullptr);
}

// Inputs that take every path: ordinary values over the ranges where the
// functions bend and saturate, and raw bit patterns (NaNs with payloads of
// both signs, infinities, subnormals, huge values).
at::Tensor probe_inputs(c10::ScalarType dtype, int64_t n) {
  at::Tensor x = at::empty({n}, at::TensorOptions().dtype(dtype));
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
  };
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = next();
    if (dtype == at::kFloat) {
      float v = i % 2 ? (int64_t(r % 2000001) - 1000000) * 1e-4f : 0;
      if (i % 2 == 0) std::memcpy(&v, &r, sizeof v);
      x.data_ptr<float>()[i] = v;
    } else {
      double v = i % 2 ? (int64_t(r % 20000001) - 10000000) * 1e-5 : 0;
      if (i % 2 == 0) std::memcpy(&v, &r, sizeof v);
      x.data_ptr<double>()[i] = v;
    }
  }
  return x;
}

bool check(Fn fn, c10::ScalarType dtype) {
  if (!available(fn, dtype)) return false;
  const at::Tensor x = probe_inputs(dtype, 4096 + 31);
  // Call lengths with each kind of remainder: none, one vector, a part of one.
  for (int64_t n : {4096, 4096 + 8, 4096 + 16, 4096 + 21, 4096 + 31}) {
    const at::Tensor in = x.narrow(0, 0, n);  // one call: below ATen's grain, on one thread
    const at::Tensor want = fn == Fn::Sigmoid ? at::sigmoid(in) : at::tanh(in);
    at::Tensor got = at::empty({n}, in.options());
    run(fn, dtype, static_cast<char*>(got.data_ptr()), static_cast<const char*>(in.data_ptr()), n);
    if (std::memcmp(got.data_ptr(), want.data_ptr(), want.nbytes()) != 0) return false;
  }
  return true;
}

} // namespace

bool matches_aten(Fn fn, c10::ScalarType dtype) {
  if (dtype != at::kFloat && dtype != at::kDouble) return false;
  static const bool checked[2][2] = {{check(Fn::Sigmoid, at::kFloat), check(Fn::Sigmoid, at::kDouble)},
                                     {check(Fn::Tanh, at::kFloat), check(Fn::Tanh, at::kDouble)}};
  return checked[fn == Fn::Tanh][dtype == at::kDouble];
}

void run(Fn fn, c10::ScalarType dtype, char* out, const char* x, int64_t n) {
  if (dtype == at::kFloat) {
    auto* o = reinterpret_cast<float*>(out);
    auto* a = reinterpret_cast<const float*>(x);
    fn == Fn::Sigmoid ? sigmoid_avx512(o, a, n) : vmsTanh(n, a, o, kVmlMode);
  } else {
    auto* o = reinterpret_cast<double*>(out);
    auto* a = reinterpret_cast<const double*>(x);
    fn == Fn::Sigmoid ? sigmoid_avx512(o, a, n) : vmdTanh(n, a, o, kVmlMode);
  }
}

} // namespace torchneuron::transcendental
