// The device's own loops for ATen's AVX2 capability (AVX2 and FMA), compiled
// for it alone: the target pragma below applies to every function this unit
// defines, as -m flags would, while what its includes define stays baseline
// code. x86-64 only; kernels() runs it only where the host has it (isa.h).
#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "exact_arithmetic.h"
#include "isa.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")
// O3: GCC's -O2 cost model leaves the exact loops scalar (they need a
// run-time check that `out` and an input coincide or not). fp-contract=off: a
// multiply and an add stay two roundings (GCC would fuse them where the
// target has FMA), so every level computes what its source says.
#pragma GCC optimize("O3", "fp-contract=off")

// The exp that ATen's vectorised sigmoid calls at this level (SLEEF's, linked
// into libtorch_cpu; weak, as in isa_avx512.cpp).
extern "C" {
__m256 Sleef_expf8_u10(__m256) __attribute__((weak));
__m256d Sleef_expd4_u10(__m256d) __attribute__((weak));
}

namespace torchneuron::isa {
namespace {

#define TORCHNEURON_INLINE __attribute__((always_inline)) inline

// SLEEF's expf8_u10 written out inline, step for step: q = x / ln 2 rounded
// to an integer, x - q ln 2 in two parts, the degree-6 polynomial, u * 2^q as
// two powers of two (the first product is exact, so the second rounds once,
// as isa_avx512.cpp's scalef does), then the bounds. Inline for the reason
// isa_avx512.cpp gives; sigmoid_ready checks it against the library once per
// process.
// q = x / ln 2 rounded to an integer, and u = e^(x - q ln 2) by the
// library's polynomial.
TORCHNEURON_INLINE __m256 exp_reduced(__m256 x, __m256i* q_out) {
  const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(x, _mm256_set1_ps(0x1.715476p+0f)));
  const __m256 qf = _mm256_cvtepi32_ps(q);
  __m256 s = _mm256_fmadd_ps(qf, _mm256_set1_ps(-0x1.62e4p-1f), x);
  s = _mm256_fmadd_ps(qf, _mm256_set1_ps(-0x1.7f7d1cp-20f), s);
  __m256 u = _mm256_set1_ps(0x1.a057b4p-13f);
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0x1.6d2d92p-10f));
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0x1.11114cp-7f));
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0x1.5554f4p-5f));
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0x1.555556p-3f));
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0x1.0p-1f));
  *q_out = q;
  return _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(s, s), u, s), _mm256_set1_ps(1.0f));
}

// 2^q as a float, for q + 127 in [1, 254]; q = INT_MIN (a NaN's) gives 1.
TORCHNEURON_INLINE __m256 power_of_two(__m256i q) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(q, _mm256_set1_epi32(0x7f)), 23));
}

TORCHNEURON_INLINE __m256 exp_like_sleef(__m256 x) {
  asm("" : "+x"(x));  // as isa_avx512.cpp: keep a negation that produced x
  __m256i q;
  const __m256 u = exp_reduced(x, &q);
  // Within [-87, 88] (NaN is not), q + 127 is in [1, 254]: one power of two
  // scales u as the library's two do, and the bounds change nothing.
  const __m256 in_range = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ),
                                        _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_LE_OQ));
  if (_mm256_movemask_ps(in_range) == 0xff) return _mm256_mul_ps(u, power_of_two(q));
  const __m256i half = _mm256_srai_epi32(q, 1);
  __m256 e = _mm256_mul_ps(_mm256_mul_ps(u, power_of_two(half)), power_of_two(_mm256_sub_epi32(q, half)));
  e = _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-104.0f), _CMP_LT_OQ), e);
  return _mm256_blendv_ps(e, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(_mm256_set1_ps(100.0f), x, _CMP_LT_OQ));
}

// The device's own tanh (tanh.h), eight lanes at a time: isa_avx512.cpp's
// operations one for one, so the same bits. Its exp takes 2|x| <= 88, where
// q <= 127 and one power of two scales u exactly as the library's two do.
TORCHNEURON_INLINE __m256 tanh_float8(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
  const __m256 a = _mm256_andnot_ps(sign, x);
  const __m256 z = _mm256_mul_ps(a, a);
  __m256 p = _mm256_set1_ps(0x1.fd7b92p-14f);
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-0x1.b8ff36p-11f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(0x1.93845ap-9f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-0x1.19a506p-7f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(0x1.64ebc8p-6f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-0x1.b9fbd8p-5f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(0x1.11105ep-3f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-0x1.555552p-2f));
  __m256 y = _mm256_fmadd_ps(_mm256_mul_ps(a, z), p, a);
  const __m256 small = _mm256_cmp_ps(a, one, _CMP_LT_OQ);
  if (_mm256_movemask_ps(small) != 0xff) {
    __m256i q;
    const __m256 u = exp_reduced(_mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_add_ps(a, a)), &q);
    const __m256 e = _mm256_mul_ps(u, power_of_two(q));
    const __m256 large = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(one, e)));
    y = _mm256_blendv_ps(large, y, small);
  }
  return _mm256_or_ps(y, _mm256_and_ps(sign, x));
}

// simd_loops.h's operations. Eight vectors a chunk fill the 16 registers
// with acc and arg, so some spill to L1; four, with half the micro-ops'
// dispatches amortised, ran chains slower.
constexpr int chain_vectors = 8;

template <typename T>
struct S;

template <>
struct S<float> {
  using V = __m256;
  using Mask = __m256;
  static constexpr int64_t lanes = 8;
  static constexpr bool inline_exp = true;
  static TORCHNEURON_INLINE V load(const float* p) { return _mm256_loadu_ps(p); }
  static TORCHNEURON_INLINE void store(float* p, V v, bool stream) {
    stream ? _mm256_stream_ps(p, v) : _mm256_storeu_ps(p, v);
  }
  static TORCHNEURON_INLINE V splat(float x) { return _mm256_set1_ps(x); }
  static TORCHNEURON_INLINE V add(V a, V b) { return _mm256_add_ps(a, b); }
  static TORCHNEURON_INLINE V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static TORCHNEURON_INLINE V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static TORCHNEURON_INLINE V div(V a, V b) { return _mm256_div_ps(a, b); }
  static TORCHNEURON_INLINE V flip_sign(V a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
  static TORCHNEURON_INLINE V clear_sign(V a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  static TORCHNEURON_INLINE V max(V bound, V a) { return _mm256_max_ps(bound, a); }
  static TORCHNEURON_INLINE V min(V bound, V a) { return _mm256_min_ps(bound, a); }
  static TORCHNEURON_INLINE Mask none() { return _mm256_setzero_ps(); }
  static TORCHNEURON_INLINE Mask two_nans(Mask m, V a, V b) {
    return _mm256_or_ps(m, _mm256_and_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q), _mm256_cmp_ps(b, b, _CMP_UNORD_Q)));
  }
  static TORCHNEURON_INLINE Mask either_nan(Mask m, V a, V b) { return _mm256_or_ps(m, _mm256_cmp_ps(a, b, _CMP_UNORD_Q)); }
  static TORCHNEURON_INLINE bool any(Mask m) { return _mm256_movemask_ps(m) != 0; }
  static TORCHNEURON_INLINE V exp(V a) { return exp_like_sleef(a); }
  static TORCHNEURON_INLINE V library_exp(V a) { return Sleef_expf8_u10(a); }
  static bool library_present() { return Sleef_expf8_u10 != nullptr; }
  static TORCHNEURON_INLINE V tanh(V a) { return tanh_float8(a); }
  static TORCHNEURON_INLINE void fence() { _mm_sfence(); }
};

template <>
struct S<double> {
  using V = __m256d;
  using Mask = __m256d;
  static constexpr int64_t lanes = 4;
  static TORCHNEURON_INLINE V load(const double* p) { return _mm256_loadu_pd(p); }
  static TORCHNEURON_INLINE void store(double* p, V v, bool stream) {
    stream ? _mm256_stream_pd(p, v) : _mm256_storeu_pd(p, v);
  }
  static TORCHNEURON_INLINE V splat(double x) { return _mm256_set1_pd(x); }
  static TORCHNEURON_INLINE V add(V a, V b) { return _mm256_add_pd(a, b); }
  static TORCHNEURON_INLINE V sub(V a, V b) { return _mm256_sub_pd(a, b); }
  static TORCHNEURON_INLINE V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  static TORCHNEURON_INLINE V div(V a, V b) { return _mm256_div_pd(a, b); }
  static TORCHNEURON_INLINE V flip_sign(V a) { return _mm256_xor_pd(a, _mm256_set1_pd(-0.0)); }
  static TORCHNEURON_INLINE V clear_sign(V a) { return _mm256_andnot_pd(_mm256_set1_pd(-0.0), a); }
  static TORCHNEURON_INLINE V max(V bound, V a) { return _mm256_max_pd(bound, a); }
  static TORCHNEURON_INLINE V min(V bound, V a) { return _mm256_min_pd(bound, a); }
  static TORCHNEURON_INLINE Mask none() { return _mm256_setzero_pd(); }
  static TORCHNEURON_INLINE Mask two_nans(Mask m, V a, V b) {
    return _mm256_or_pd(m, _mm256_and_pd(_mm256_cmp_pd(a, a, _CMP_UNORD_Q), _mm256_cmp_pd(b, b, _CMP_UNORD_Q)));
  }
  static TORCHNEURON_INLINE Mask either_nan(Mask m, V a, V b) { return _mm256_or_pd(m, _mm256_cmp_pd(a, b, _CMP_UNORD_Q)); }
  static TORCHNEURON_INLINE bool any(Mask m) { return _mm256_movemask_pd(m) != 0; }
  static TORCHNEURON_INLINE V exp(V a) { return Sleef_expd4_u10(a); }
  static bool library_present() { return Sleef_expd4_u10 != nullptr; }
};

#undef TORCHNEURON_INLINE

} // namespace

#include "simd_loops.h"

extern const Kernels kAvx2{"avx2",          run_exact_here,        run_chain_here,       chain_vectors * 32,
                           tanh_here,       sigmoid_here<float>,   sigmoid_here<double>, sigmoid_ready_here,
                           stream_copy_here, end_streaming_here, round_to_bf16_here};

} // namespace torchneuron::isa

#pragma GCC pop_options

#endif // __x86_64__
