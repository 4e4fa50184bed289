// The device's own loops for ATen's AVX512 capability (F, DQ, BW and VL:
// without DQ, GCC spells a comparison's mask out lane by lane), compiled for
// it alone: the target pragma below applies to every function this unit
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
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")
// O3: GCC's -O2 cost model leaves the exact loops scalar (they need a
// run-time check that `out` and an input coincide or not). fp-contract=off: a
// multiply and an add stay two roundings (GCC would fuse them where the
// target has FMA), so every level computes what its source says.
#pragma GCC optimize("O3", "fp-contract=off")

// The exp that ATen's vectorised sigmoid calls at this level: SLEEF's, linked
// into libtorch_cpu. Weak: a build without it leaves sigmoid to ATen instead
// of failing to load.
extern "C" {
__m512 Sleef_expf16_u10(__m512) __attribute__((weak));
__m512d Sleef_expd8_u10(__m512d) __attribute__((weak));
}

namespace torchneuron::isa {
namespace {

#define TORCHNEURON_INLINE __attribute__((always_inline)) inline

// x / ln 2 rounded to nearest (q, kept as a float: the library converts it
// to an integer and back, which gives the same value wherever the result is
// not overridden by the bounds), and e^x before the bounds: u * 2^q. The
// library multiplies by 2^(q/2), which is exact (u is near 1, q/2 >= -75 in
// range), then by 2^(q - q/2), rounding once: the single rounding of scalef.
TORCHNEURON_INLINE __m512 exp_unbounded(__m512 x) {
  const __m512 q = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(0x1.715476p+0f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 s = _mm512_fmadd_ps(q, _mm512_set1_ps(-0x1.62e4p-1f), x);  // x - q ln 2, in two parts
  s = _mm512_fmadd_ps(q, _mm512_set1_ps(-0x1.7f7d1cp-20f), s);
  __m512 u = _mm512_set1_ps(0x1.a057b4p-13f);
  u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0x1.6d2d92p-10f));
  u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0x1.11114cp-7f));
  u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0x1.5554f4p-5f));
  u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0x1.555556p-3f));
  u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0x1.0p-1f));
  u = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(s, s), u, s), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(u, q);
}

// SLEEF's expf16_u10 written out inline: the library's algorithm (Cody-Waite
// reduction by ln 2, a degree-6 polynomial, scaling by 2^q, then the bounds)
// with its constants. Two steps take fewer instructions for the same values:
// q stays a float instead of a round trip through an integer, and the scaling
// is one scalef instead of integer arithmetic building two powers of two (see
// below). A call clobbers every vector register, so a chain computing sigmoid
// on several vectors at a time spilled its values around each call; inline,
// they stay in registers. Its only NaN source is x, so NaN payloads survive as
// in the library. sigmoid_ready checks it against the library once per
// process. isa_avx2.cpp and isa_portable.cpp compute the same values with the
// library's integer steps.
TORCHNEURON_INLINE __m512 exp_like_sleef(__m512 x) {
  // x as a value of its own: GCC may otherwise fold a negation that produced
  // it into a constant below ((-v) * c as v * -c), which flips a NaN's sign
  // (GCC does not keep NaN signs; the library's result keeps x's).
  asm("" : "+v"(x));
  const __m512 u = _mm512_mask_mov_ps(exp_unbounded(x), _mm512_cmp_ps_mask(x, _mm512_set1_ps(-104.0f), _CMP_LT_OQ),
                                      _mm512_setzero_ps());
  return _mm512_mask_mov_ps(u, _mm512_cmp_ps_mask(_mm512_set1_ps(100.0f), x, _CMP_LT_OQ),
                            _mm512_set1_ps(__builtin_inff()));
}

// The device's own tanh (tanh.h), sixteen lanes at a time.
TORCHNEURON_INLINE __m512 tanh_float16(__m512 x) {
  const __m512i sign = _mm512_set1_epi32(int32_t(0x80000000u));
  const __m512 a = _mm512_castsi512_ps(_mm512_andnot_si512(sign, _mm512_castps_si512(x)));
  // |x| < 1: |x| + |x|^3 P(x^2), P of degree 7 fitted for the least largest
  // relative error of the result (an iteratively reweighted least-squares fit
  // in double, coefficients rounded to float). The correction term is at most
  // a third of the result, so its errors shrink too; subnormals give |x|.
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 z = _mm512_mul_ps(a, a);
  __m512 p = _mm512_set1_ps(0x1.fd7b92p-14f);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-0x1.b8ff36p-11f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(0x1.93845ap-9f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-0x1.19a506p-7f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(0x1.64ebc8p-6f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-0x1.b9fbd8p-5f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(0x1.11105ep-3f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-0x1.555552p-2f));
  __m512 y = _mm512_fmadd_ps(_mm512_mul_ps(a, z), p, a);
  // |x| >= 1, or NaN (which compares false and keeps its payload through
  // exp): 1 - 2 / (1 + e^2|x|), computed only where some lane needs it. The
  // quotient is at most 0.24, so its rounding errors and exp's (under one
  // ulp) shrink by the subtraction. Anything above 9.01 gives exactly 1, so
  // 2|x| is capped at 88 (NaN kept), where e^88 is finite and the bounds
  // change nothing.
  const __mmask16 small = _mm512_cmp_ps_mask(a, one, _CMP_LT_OQ);
  if (small != 0xffff) {
    const __m512 e = exp_unbounded(_mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_add_ps(a, a)));
    const __m512 large = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(one, e)));
    y = _mm512_mask_mov_ps(large, small, y);
  }
  // x's sign goes back on every result.
  return _mm512_castsi512_ps(
      _mm512_or_si512(_mm512_castps_si512(y), _mm512_and_si512(sign, _mm512_castps_si512(x))));
}

// simd_loops.h's operations. Eight vectors a chunk keep acc and arg in 16 of
// the 32 registers.
constexpr int chain_vectors = 8;

template <typename T>
struct S;

template <>
struct S<float> {
  using V = __m512;
  using Mask = __mmask16;
  static constexpr int64_t lanes = 16;
  static constexpr bool inline_exp = true;
  static TORCHNEURON_INLINE V load(const float* p) { return _mm512_loadu_ps(p); }
  static TORCHNEURON_INLINE void store(float* p, V v, bool stream) {
    stream ? _mm512_stream_ps(p, v) : _mm512_storeu_ps(p, v);
  }
  static TORCHNEURON_INLINE V splat(float x) { return _mm512_set1_ps(x); }
  static TORCHNEURON_INLINE V add(V a, V b) { return _mm512_add_ps(a, b); }
  static TORCHNEURON_INLINE V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static TORCHNEURON_INLINE V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static TORCHNEURON_INLINE V div(V a, V b) { return _mm512_div_ps(a, b); }
  static TORCHNEURON_INLINE V flip_sign(V a) { return _mm512_xor_ps(a, _mm512_set1_ps(-0.0f)); }
  static TORCHNEURON_INLINE V clear_sign(V a) { return _mm512_andnot_ps(_mm512_set1_ps(-0.0f), a); }
  static TORCHNEURON_INLINE V max(V bound, V a) { return _mm512_max_ps(bound, a); }
  static TORCHNEURON_INLINE V min(V bound, V a) { return _mm512_min_ps(bound, a); }
  static TORCHNEURON_INLINE Mask none() { return 0; }
  static TORCHNEURON_INLINE Mask two_nans(Mask m, V a, V b) {
    return m | (_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) & _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q));
  }
  static TORCHNEURON_INLINE Mask either_nan(Mask m, V a, V b) { return m | _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q); }
  static TORCHNEURON_INLINE bool any(Mask m) { return m != 0; }
  static TORCHNEURON_INLINE V exp(V a) { return exp_like_sleef(a); }
  static TORCHNEURON_INLINE V library_exp(V a) { return Sleef_expf16_u10(a); }
  static bool library_present() { return Sleef_expf16_u10 != nullptr; }
  static TORCHNEURON_INLINE V tanh(V a) { return tanh_float16(a); }
  static TORCHNEURON_INLINE void fence() { _mm_sfence(); }
};

template <>
struct S<double> {
  using V = __m512d;
  using Mask = __mmask8;
  static constexpr int64_t lanes = 8;
  static TORCHNEURON_INLINE V load(const double* p) { return _mm512_loadu_pd(p); }
  static TORCHNEURON_INLINE void store(double* p, V v, bool stream) {
    stream ? _mm512_stream_pd(p, v) : _mm512_storeu_pd(p, v);
  }
  static TORCHNEURON_INLINE V splat(double x) { return _mm512_set1_pd(x); }
  static TORCHNEURON_INLINE V add(V a, V b) { return _mm512_add_pd(a, b); }
  static TORCHNEURON_INLINE V sub(V a, V b) { return _mm512_sub_pd(a, b); }
  static TORCHNEURON_INLINE V mul(V a, V b) { return _mm512_mul_pd(a, b); }
  static TORCHNEURON_INLINE V div(V a, V b) { return _mm512_div_pd(a, b); }
  static TORCHNEURON_INLINE V flip_sign(V a) { return _mm512_xor_pd(a, _mm512_set1_pd(-0.0)); }
  static TORCHNEURON_INLINE V clear_sign(V a) { return _mm512_andnot_pd(_mm512_set1_pd(-0.0), a); }
  static TORCHNEURON_INLINE V max(V bound, V a) { return _mm512_max_pd(bound, a); }
  static TORCHNEURON_INLINE V min(V bound, V a) { return _mm512_min_pd(bound, a); }
  static TORCHNEURON_INLINE Mask none() { return 0; }
  static TORCHNEURON_INLINE Mask two_nans(Mask m, V a, V b) {
    return m | (_mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q) & _mm512_cmp_pd_mask(b, b, _CMP_UNORD_Q));
  }
  static TORCHNEURON_INLINE Mask either_nan(Mask m, V a, V b) { return m | _mm512_cmp_pd_mask(a, b, _CMP_UNORD_Q); }
  static TORCHNEURON_INLINE bool any(Mask m) { return m != 0; }
  static TORCHNEURON_INLINE V exp(V a) { return Sleef_expd8_u10(a); }
  static bool library_present() { return Sleef_expd8_u10 != nullptr; }
};

#undef TORCHNEURON_INLINE

} // namespace

#include "simd_loops.h"

extern const Kernels kAvx512{"avx512",        run_exact_here,        run_chain_here,     chain_vectors * 64,
                             tanh_here,       sigmoid_here<float>,   sigmoid_here<double>, sigmoid_ready_here,
                             stream_copy_here, end_streaming_here, round_to_bf16_here};

} // namespace torchneuron::isa

#pragma GCC pop_options

#endif // __x86_64__
