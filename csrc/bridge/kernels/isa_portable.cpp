// The device's own loops for every other host (ATen's DEFAULT capability,
// ATEN_CPU_CAPABILITY=default, aarch64, ...): plain C++ and GCC's generic
// vectors of 16 bytes, which the compiler maps to the baseline instruction
// set (SSE2 on x86-64, NEON on aarch64).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>  // non-temporal stores, part of every x86-64
#endif

#include "exact_arithmetic.h"
#include "isa.h"

#pragma GCC push_options
// O3: GCC's -O2 cost model leaves the exact loops scalar (they need a
// run-time check that `out` and an input coincide or not). fp-contract=off: a
// multiply and an add stay two roundings (GCC would fuse them where the
// target has FMA), so every level computes what its source says.
#pragma GCC optimize("O3", "fp-contract=off")

namespace torchneuron::isa {
namespace {

#define TORCHNEURON_INLINE __attribute__((always_inline)) inline

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// The device's own tanh (tanh.h), one element: isa_avx2.cpp's operations one for
// one, with std::fma for each fused multiply-add, so the same bits. Its exp
// (SLEEF's expf, as there) takes 2|x| <= 88; ATen's sigmoid at this level
// calls libm's exp instead.
inline float tanh_float1(float x) {
  const uint32_t sign = bits_of(x) & 0x80000000u;
  const float a = from_bits(bits_of(x) & 0x7fffffffu);
  const float z = a * a;
  float p = 0x1.fd7b92p-14f;
  p = std::fma(p, z, -0x1.b8ff36p-11f);
  p = std::fma(p, z, 0x1.93845ap-9f);
  p = std::fma(p, z, -0x1.19a506p-7f);
  p = std::fma(p, z, 0x1.64ebc8p-6f);
  p = std::fma(p, z, -0x1.b9fbd8p-5f);
  p = std::fma(p, z, 0x1.11105ep-3f);
  p = std::fma(p, z, -0x1.555552p-2f);
  float y = std::fma(a * z, p, a);
  if (!(a < 1.0f)) {
    const float t = 88.0f < a + a ? 88.0f : a + a;  // NaN stays NaN
    const float q = std::nearbyint(t * 0x1.715476p+0f);
    float s = std::fma(q, -0x1.62e4p-1f, t);
    s = std::fma(q, -0x1.7f7d1cp-20f, s);
    float u = 0x1.a057b4p-13f;
    u = std::fma(u, s, 0x1.6d2d92p-10f);
    u = std::fma(u, s, 0x1.11114cp-7f);
    u = std::fma(u, s, 0x1.5554f4p-5f);
    u = std::fma(u, s, 0x1.555556p-3f);
    u = std::fma(u, s, 0x1.0p-1f);
    u = std::fma(s * s, u, s) + 1.0f;
    const int k = q == q ? int(q) : 0;  // NaN: u is NaN already
    const float e = u * from_bits(uint32_t(k + 0x7f) << 23);
    y = 1.0f - 2.0f / (1.0f + e);
  }
  return from_bits(bits_of(y) | sign);
}

// simd_loops.h's operations on GCC's generic vectors.
constexpr int chain_vectors = 8;

typedef float F32x4 __attribute__((vector_size(16)));
typedef double F64x2 __attribute__((vector_size(16)));
typedef int32_t I32x4 __attribute__((vector_size(16)));
typedef int64_t I64x2 __attribute__((vector_size(16)));

template <typename T>
struct S {
  static constexpr bool is_float = std::is_same_v<T, float>;
  using I = std::conditional_t<is_float, int32_t, int64_t>;
  using V = std::conditional_t<is_float, F32x4, F64x2>;
  using Mask = std::conditional_t<is_float, I32x4, I64x2>;
  static constexpr int64_t lanes = 16 / sizeof(T);
  static constexpr bool inline_exp = false;
  static TORCHNEURON_INLINE V load(const T* p) {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static TORCHNEURON_INLINE void store(T* p, V v, bool stream) {
#if defined(__SSE2__)
    if (stream) return _mm_stream_si128(reinterpret_cast<__m128i*>(p), reinterpret_cast<__m128i&>(v));
#endif
    std::memcpy(p, &v, sizeof v);
  }
  static TORCHNEURON_INLINE V splat(T x) { return V{} + x; }
  static TORCHNEURON_INLINE V add(V a, V b) { return a + b; }
  static TORCHNEURON_INLINE V sub(V a, V b) { return a - b; }
  static TORCHNEURON_INLINE V mul(V a, V b) { return a * b; }
  static TORCHNEURON_INLINE V div(V a, V b) { return a / b; }
  static TORCHNEURON_INLINE V flip_sign(V a) { return (V)((Mask)a ^ sign()); }
  static TORCHNEURON_INLINE V clear_sign(V a) { return (V)((Mask)a & ~sign()); }
  static TORCHNEURON_INLINE V max(V bound, V a) { return bound > a ? bound : a; }
  static TORCHNEURON_INLINE V min(V bound, V a) { return bound < a ? bound : a; }
  static TORCHNEURON_INLINE Mask none() { return Mask{}; }
  static TORCHNEURON_INLINE Mask two_nans(Mask m, V a, V b) { return m | ((a != a) & (b != b)); }
  static TORCHNEURON_INLINE Mask either_nan(Mask m, V a, V b) { return m | (a != a) | (b != b); }
  static TORCHNEURON_INLINE bool any(Mask m) {
    I any = 0;
    for (int64_t i = 0; i < lanes; ++i) any |= m[i];
    return any != 0;
  }
  // libm's exp per element: ATen's generic vectors map std::exp over their
  // elements.
  static TORCHNEURON_INLINE V exp(V a) {
    for (int64_t i = 0; i < lanes; ++i) a[i] = std::exp(a[i]);
    return a;
  }
  static bool library_present() { return true; }
  static TORCHNEURON_INLINE V tanh(V a) {
    for (int64_t i = 0; i < lanes; ++i) a[i] = tanh_float1(a[i]);
    return a;
  }
  static TORCHNEURON_INLINE void fence() {
#if defined(__SSE2__)
    _mm_sfence();
#endif
  }

 private:
  static TORCHNEURON_INLINE Mask sign() { return Mask{} + (I(1) << (8 * sizeof(T) - 1)); }
};

#undef TORCHNEURON_INLINE

} // namespace

#include "simd_loops.h"

extern const Kernels kPortable{"portable",     run_exact_here,        run_chain_here,       chain_vectors * 16,
                               tanh_here,       sigmoid_here<float>,   sigmoid_here<double>, sigmoid_ready_here,
                               stream_copy_here, end_streaming_here, round_to_bf16_here};

} // namespace torchneuron::isa

#pragma GCC pop_options
