// The exp that ATen's vectorised sigmoid calls on its AVX512 path: SLEEF's
// expf16_u10 (and expd8_u10), linked into libtorch_cpu. Weak: a build
// without them leaves sigmoid to ATen instead of failing to load.
//
// `exp_like_sleef` is the float one written out inline: the library's
// algorithm (Cody-Waite reduction by ln 2, a degree-6 polynomial, scaling by
// 2^q, then the bounds) with its constants, taken from libtorch_cpu's copy.
// Two steps take fewer instructions for the same values: q stays a float
// instead of a round trip through an integer, and the scaling is one scalef
// instead of integer arithmetic building two powers of two (see below).
// A call clobbers every vector register, so a chain computing sigmoid on
// several vectors at a time spilled its values around each call; inline, they
// stay in registers. Its only NaN source is x, so NaN payloads survive as in
// the library. It was checked against the library over all 2^32 inputs when
// written, and vector_math.cpp checks it against the library on a sweep of
// inputs once per process (a mismatch leaves sigmoid to ATen). The device's
// tanh (tanh.h) uses it too; that function's accuracy is tested on its own.
#pragma once

#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f")
extern "C" {
__m512 Sleef_expf16_u10(__m512) __attribute__((weak));
__m512d Sleef_expd8_u10(__m512d) __attribute__((weak));
}

namespace torchneuron {

__attribute__((always_inline)) inline __m512 exp_like_sleef(__m512 x) {
  // x as a value of its own: GCC may otherwise fold a negation that produced
  // it into a constant below ((-v) * c as v * -c), which flips a NaN's sign
  // (GCC does not keep NaN signs; the library's result keeps x's).
  asm("" : "+v"(x));
  // q = x / ln 2 rounded to nearest, kept as a float: the library converts
  // it to an integer and back, which gives the same value wherever the result
  // is not overridden by the bounds below.
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
  // u * 2^q. The library multiplies by 2^(q/2), which is exact (u is near 1,
  // q/2 >= -75 in range), then by 2^(q - q/2), rounding once: the single
  // rounding of scalef.
  u = _mm512_scalef_ps(u, q);
  u = _mm512_mask_mov_ps(u, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-104.0f), _CMP_LT_OQ), _mm512_setzero_ps());
  return _mm512_mask_mov_ps(u, _mm512_cmp_ps_mask(_mm512_set1_ps(100.0f), x, _CMP_LT_OQ),
                            _mm512_set1_ps(__builtin_inff()));
}

} // namespace torchneuron
#pragma GCC pop_options
