// The device's float32 tanh: its own function, as a NeuronCore's activation
// engine has its own, rather than the CPU's (MKL's VML, a library call).
//
// Why: written inline, fused chains compute it in registers while the chain
// streams its operands, where a library call is a stretch with no memory
// request in flight (benchmarks/RESULTS.md, the fused chains).
//
// Accuracy: faithfully rounded (under one ulp against tanh computed in
// double, over every float), as MKL's on the CPU is, so the two are the same
// float or neighbours (tests/test_device_tanh.py measures both;
// docs/numerics.md). NaN in gives the same NaN, quieted; tanh(-0) is -0.
//
// Every element is the same arithmetic, whatever its position or the length
// of the call, so any cut of the work (threads, fusion's slices, chains'
// chunks, a masked tail) gives the same bits: fused and unfused agree.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "sleef_exp.h"

namespace torchneuron::kernels {

#pragma GCC push_options
#pragma GCC target("avx512f")

__attribute__((always_inline)) inline __m512 tanh_float16(__m512 x) {
  const __m512i sign = _mm512_set1_epi32(int32_t(0x80000000u));
  const __m512 a = _mm512_castsi512_ps(_mm512_andnot_si512(sign, _mm512_castps_si512(x)));
  // |x| >= 1: 1 - 2 / (1 + e^2|x|). The quotient is at most 0.24, so its
  // rounding errors and exp's (under one ulp) shrink by the subtraction;
  // e^2|x| = inf (|x| > 44) gives exactly 1, as does anything above 9.01.
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = exp_like_sleef(_mm512_add_ps(a, a));
  const __m512 large = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(one, e)));
  // |x| < 1: |x| + |x|^3 P(x^2), P of degree 7 fitted for the least largest
  // relative error of the result (an iteratively reweighted least-squares fit
  // in double, coefficients rounded to float). The correction term is at most
  // a third of the result, so its errors shrink too; subnormals give |x|.
  const __m512 z = _mm512_mul_ps(a, a);
  __m512 p = _mm512_set1_ps(0x1.fd7b92p-14f);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-0x1.b8ff36p-11f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(0x1.93845ap-9f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-0x1.19a506p-7f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(0x1.64ebc8p-6f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-0x1.b9fbd8p-5f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(0x1.11105ep-3f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-0x1.555552p-2f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(a, z), p, a);
  // A NaN compares false and takes the first form, which keeps its payload;
  // x's sign then goes back on every result.
  const __m512 y = _mm512_mask_mov_ps(large, _mm512_cmp_ps_mask(a, one, _CMP_LT_OQ), small);
  return _mm512_castsi512_ps(
      _mm512_or_si512(_mm512_castps_si512(y), _mm512_and_si512(sign, _mm512_castps_si512(x))));
}

#pragma GCC pop_options

// Whether this host computes the device's tanh (it needs AVX-512). Where it
// does not, the device's float32 tanh is the CPU's.
bool has_own_tanh();

// out[i] = tanh(x[i]) for i < n, on one thread; out may be x.
void tanh_float(float* out, const float* x, int64_t n);

} // namespace torchneuron::kernels
