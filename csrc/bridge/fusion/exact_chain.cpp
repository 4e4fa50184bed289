// run_chain (exact_arithmetic.h): a chain of exact members computed in
// registers, a chunk of four AVX-512 vectors at a time. Every operation is
// the single IEEE operation, or the choice, that run_exact's loops (and
// ATen's kernels) make per element, so the results are the same bits.
#include <ATen/Version.h>  // get_cpu_capability

#include <immintrin.h>

#include <cmath>
#include <string>

#include "exact_arithmetic.h"

namespace torchneuron {
namespace {

using Kind = ExactArithmetic::Kind;
constexpr int kVectors = 4;  // per chunk: independent work for the core while one op waits
// Memory operands are prefetched this far ahead, a chunk's lines at a time:
// a chain's compute fills the core's window, leaving few loads in flight
// (same-process A/B, 16M floats: chains of arithmetic 12-25 % faster).
constexpr int64_t kPrefetchBytes = 4096;

// The loops below are compiled for ATen's AVX512 capability and only ever
// called where it is present (lambdas included, hence the pragma).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl")
#define TORCHNEURON_AVX512 __attribute__((always_inline)) inline
// SLEEF's exp, as vector_math.cpp declares it (sigmoid is only chained where
// vector_math found it).
extern "C" {
__m512 Sleef_expf16_u10(__m512) __attribute__((weak));
__m512d Sleef_expd8_u10(__m512d) __attribute__((weak));
}

// The AVX-512 operations of one element type.
template <typename T>
struct Avx512;

template <>
struct Avx512<float> {
  using V = __m512;
  using Mask = __mmask16;
  static TORCHNEURON_AVX512 V load(const float* p) { return _mm512_loadu_ps(p); }
  static TORCHNEURON_AVX512 void store(float* p, V v, bool stream) {
    stream ? _mm512_stream_ps(p, v) : _mm512_storeu_ps(p, v);
  }
  static TORCHNEURON_AVX512 V splat(float x) { return _mm512_set1_ps(x); }
  static TORCHNEURON_AVX512 V add(V a, V b) { return _mm512_add_ps(a, b); }
  static TORCHNEURON_AVX512 V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static TORCHNEURON_AVX512 V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static TORCHNEURON_AVX512 V div(V a, V b) { return _mm512_div_ps(a, b); }
  static TORCHNEURON_AVX512 V flip_sign(V a) { return _mm512_xor_ps(a, _mm512_set1_ps(-0.0f)); }
  static TORCHNEURON_AVX512 V clear_sign(V a) { return _mm512_andnot_ps(_mm512_set1_ps(-0.0f), a); }
  static TORCHNEURON_AVX512 Mask less(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static TORCHNEURON_AVX512 Mask nan(V a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  static TORCHNEURON_AVX512 V pick(Mask m, V if_clear, V if_set) { return _mm512_mask_blend_ps(m, if_clear, if_set); }
  static TORCHNEURON_AVX512 V exp(V a) { return Sleef_expf16_u10(a); }
};

template <>
struct Avx512<double> {
  using V = __m512d;
  using Mask = __mmask8;
  static TORCHNEURON_AVX512 V load(const double* p) { return _mm512_loadu_pd(p); }
  static TORCHNEURON_AVX512 void store(double* p, V v, bool stream) {
    stream ? _mm512_stream_pd(p, v) : _mm512_storeu_pd(p, v);
  }
  static TORCHNEURON_AVX512 V splat(double x) { return _mm512_set1_pd(x); }
  static TORCHNEURON_AVX512 V add(V a, V b) { return _mm512_add_pd(a, b); }
  static TORCHNEURON_AVX512 V sub(V a, V b) { return _mm512_sub_pd(a, b); }
  static TORCHNEURON_AVX512 V mul(V a, V b) { return _mm512_mul_pd(a, b); }
  static TORCHNEURON_AVX512 V div(V a, V b) { return _mm512_div_pd(a, b); }
  static TORCHNEURON_AVX512 V flip_sign(V a) { return _mm512_xor_pd(a, _mm512_set1_pd(-0.0)); }
  static TORCHNEURON_AVX512 V clear_sign(V a) { return _mm512_andnot_pd(_mm512_set1_pd(-0.0), a); }
  static TORCHNEURON_AVX512 Mask less(V a, V b) { return _mm512_cmp_pd_mask(a, b, _CMP_LT_OQ); }
  static TORCHNEURON_AVX512 Mask nan(V a) { return _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q); }
  static TORCHNEURON_AVX512 V pick(Mask m, V if_clear, V if_set) { return _mm512_mask_blend_pd(m, if_clear, if_set); }
  static TORCHNEURON_AVX512 V exp(V a) { return Sleef_expd8_u10(a); }
};

// Four vectors, spelled out so that GCC keeps them in registers.
template <typename V>
struct Quad {
  V v0, v1, v2, v3;
  static TORCHNEURON_AVX512 Quad all(V v) { return {v, v, v, v}; }
  template <typename F>
  TORCHNEURON_AVX512 Quad map(F f) const { return {f(v0), f(v1), f(v2), f(v3)}; }
  template <typename F>
  TORCHNEURON_AVX512 Quad map(F f, const Quad& o) const { return {f(v0, o.v0), f(v1, o.v1), f(v2, o.v2), f(v3, o.v3)}; }
};

// An operand's chunk at element i: one branch per operand and step, not per
// vector.
template <typename T, typename Q = Quad<typename Avx512<T>::V>>
TORCHNEURON_AVX512 Q fetch(const ChainOperand& o, const Q& previous, const ExactArithmetic& op, int64_t slice, int64_t i) {
  using A = Avx512<T>;
  constexpr int64_t lanes = sizeof(typename A::V) / sizeof(T);
  switch (o.kind) {
    case ChainOperand::Previous:
      return previous;
    case ChainOperand::Single:
      return Q::all(A::splat(*reinterpret_cast<const T*>(o.data)));
    case ChainOperand::Memory:
    case ChainOperand::Slice: {
      const T* p = reinterpret_cast<const T*>(o.data) + (o.kind == ChainOperand::Slice ? i - slice : i);
      const char* ahead = reinterpret_cast<const char*>(p) + kPrefetchBytes;
      for (int line = 0; line < kVectors; ++line) _mm_prefetch(ahead + 64 * line, _MM_HINT_T0);
      return {A::load(p), A::load(p + lanes), A::load(p + 2 * lanes), A::load(p + 3 * lanes)};
    }
    case ChainOperand::None:
      break;
  }
  return Q::all(A::splat(T(op.scalar)));
}

template <typename T>
int64_t chain_avx512(const std::vector<ChainStep>& steps, int64_t slice, int64_t begin, int64_t n) {
  using A = Avx512<T>;
  using V = typename A::V;
  using Q = Quad<V>;
  constexpr int64_t lanes = sizeof(V) / sizeof(T), chunk = kVectors * lanes;
  const size_t count = steps.size();
  Q held[16];  // results bound for memory, stored once the chunk is known to be exact
  bool may_be_nan[16];  // `other` may be NaN: not a single number or a Scalar that is not
  for (size_t k = 0; k < count; ++k) {
    const ChainOperand& o = steps[k].other;
    may_be_nan[k] = o.kind == ChainOperand::Single ? std::isnan(*reinterpret_cast<const T*>(o.data))
                    : o.kind == ChainOperand::None ? std::isnan(T(steps[k].op->scalar))
                                                   : true;
  }
  int64_t i = begin;
  for (; i + chunk <= begin + n; i += chunk) {
    Q value;  // what the last step produced
    typename A::Mask two_nans = 0;
    for (size_t k = 0; k < count; ++k) {
      const ChainStep& step = steps[k];
      const ExactArithmetic& op = *step.op;
      const Q x = fetch<T>(step.self, value, op, slice, i);
      switch (op.kind) {
        case Kind::Add:
        case Kind::Sub:
        case Kind::Mul:
        case Kind::Div: {
          const Q y = fetch<T>(step.other, value, op, slice, i);
          if (may_be_nan[k])
            two_nans |= (A::nan(x.v0) & A::nan(y.v0)) | (A::nan(x.v1) & A::nan(y.v1)) |
                        (A::nan(x.v2) & A::nan(y.v2)) | (A::nan(x.v3) & A::nan(y.v3));
          if (op.kind == Kind::Add) value = x.map(A::add, y);
          if (op.kind == Kind::Sub) value = x.map(A::sub, y);
          if (op.kind == Kind::Mul) value = x.map(A::mul, y);
          if (op.kind == Kind::Div) value = x.map(A::div, y);
          break;
        }
        case Kind::Neg:
          value = x.map(A::flip_sign);
          break;
        case Kind::Abs:
          value = x.map(A::clear_sign);
          break;
        case Kind::Reciprocal:
          value = x.map([](V a) { return A::div(A::splat(T(1)), a); });
          break;
        case Kind::Clamp: {
          // As run_exact: max with lo, then min with hi, keeping x when it is
          // NaN or equal to the bound.
          const V lo = A::splat(T(op.lo.value_or(0))), hi = A::splat(T(op.hi.value_or(0)));
          value = x;
          if (op.lo) value = value.map([&](V a) { return A::pick(A::less(a, lo), a, lo); });
          if (op.hi) value = value.map([&](V a) { return A::pick(A::less(hi, a), a, hi); });
          break;
        }
        case Kind::Function: {  // sigmoid, as vector_math's loop: chain_of chains no other function
          const V one = A::splat(T(1));
          value = x.map([&](V a) { return A::div(one, A::add(A::exp(A::flip_sign(a)), one)); });
          break;
        }
      }
      if (step.out) held[k] = value;
    }
    if (two_nans) break;
    for (size_t k = 0; k < count; ++k) {
      if (!steps[k].out) continue;
      T* out = reinterpret_cast<T*>(steps[k].out) + (steps[k].out_in_slice ? i - slice : i);
      const bool stream = steps[k].stream && reinterpret_cast<uintptr_t>(out) % sizeof(V) == 0;
      A::store(out, held[k].v0, stream);
      A::store(out + lanes, held[k].v1, stream);
      A::store(out + 2 * lanes, held[k].v2, stream);
      A::store(out + 3 * lanes, held[k].v3, stream);
    }
  }
  return i - begin;
}

#undef TORCHNEURON_AVX512
#pragma GCC pop_options

bool has_avx512() {
  static const bool yes = at::get_cpu_capability() == "AVX512";
  return yes;
}

} // namespace

int64_t chain_chunk(c10::ScalarType dtype) {
  if (!has_avx512()) return 0;
  return kVectors * 64 / int64_t(c10::elementSize(dtype));
}

int64_t run_chain(const std::vector<ChainStep>& steps, c10::ScalarType dtype, int64_t slice, int64_t begin, int64_t n) {
  TORCH_INTERNAL_ASSERT(has_avx512() && !steps.empty() && steps.size() <= 16, "run_chain: no loops for this chain");
  return dtype == at::kFloat ? chain_avx512<float>(steps, slice, begin, n) : chain_avx512<double>(steps, slice, begin, n);
}

} // namespace torchneuron
