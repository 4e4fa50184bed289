// The exp that ATen's vectorised sigmoid calls on its AVX512 path: SLEEF's
// expf16_u10 (and expd8_u10), linked into libtorch_cpu. Weak: a build
// without them leaves sigmoid to ATen instead of failing to load.
//
// `exp_like_sleef` is the float one written out inline: the same IEEE
// operations, in the same order, with the same constants as the library's
// code (Cody-Waite reduction by ln 2, a degree-6 polynomial, scaling by two
// powers of two, then the bounds). A call clobbers every vector register, so
// a chain computing sigmoid on four vectors at a time spilled its values
// around each of the four calls; inline, they stay in registers. Its only
// NaN source is x, so NaN payloads survive as in the library. It was checked
// against the library over all 2^32 inputs when written, and vector_math.cpp
// checks it against the library on a sweep of inputs once per process (a
// mismatch leaves sigmoid to ATen).
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
  const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(0x1.715476p+0f)));  // x / ln 2, rounded
  const __m512 qf = _mm512_cvtepi32_ps(q);
  __m512 s = _mm512_fmadd_ps(qf, _mm512_set1_ps(-0x1.62e4p-1f), x);  // x - q ln 2, in two parts
  s = _mm512_fmadd_ps(qf, _mm512_set1_ps(-0x1.7f7d1cp-20f), s);
  __m512 u = _mm512_set1_ps(0x1.a057b4p-13f);
  u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0x1.6d2d92p-10f));
  u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0x1.11114cp-7f));
  u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0x1.5554f4p-5f));
  u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0x1.555556p-3f));
  u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0x1.0p-1f));
  u = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(s, s), u, s), _mm512_set1_ps(1.0f));
  // u * 2^q as u * 2^(q/2) * 2^(q - q/2): each factor a normal float.
  const __m512i bias = _mm512_set1_epi32(127), half = _mm512_srai_epi32(q, 1);
  u = _mm512_mul_ps(u, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(half, bias), 23)));
  u = _mm512_mul_ps(u, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_add_epi32(q, bias), half), 23)));
  u = _mm512_mask_mov_ps(u, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-104.0f), _CMP_LT_OQ), _mm512_setzero_ps());
  return _mm512_mask_mov_ps(u, _mm512_cmp_ps_mask(_mm512_set1_ps(100.0f), x, _CMP_LT_OQ),
                            _mm512_set1_ps(__builtin_inff()));
}

} // namespace torchneuron
#pragma GCC pop_options
