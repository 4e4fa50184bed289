// O3: GCC's -O2 cost model leaves these loops scalar (they need a run-time
// check that `out` and an input coincide or not).
#pragma GCC optimize("O3")

#include "exact_arithmetic.h"

#include <ATen/ops/add.h>
#include <ATen/ops/div.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/sub.h>
#include <ATen/Version.h>  // get_cpu_capability

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <string>

namespace torchneuron {
namespace {

using Kind = ExactArithmetic::Kind;

// out[i] = f(x[i], y[i]) for i < n, where a `Full` operand steps through
// memory and a single one (step 0) is read once. With `Check`, returns
// false if some element had two NaN operands; the caller then has ATen
// recompute the slice, so `out` must not coincide with an input. Scalar
// code that GCC vectorizes for each instruction set it is inlined into (an
// int accumulates the check: GCC leaves a bool reduction scalar).
template <typename T, bool FullX, bool FullY, bool Check, typename F>
inline bool map(T* out, const T* x, const T* y, int64_t n, F f) {
  int two_nans = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T u = x[FullX ? i : 0], v = y[FullY ? i : 0];
    if (Check) two_nans |= (u != u) & (v != v);
    out[i] = f(u, v);
  }
  return two_nans == 0;
}

template <typename T, bool Check, typename F>
inline bool map(T* out, SliceOperand a, SliceOperand b, int64_t n, F f) {
  const T* x = reinterpret_cast<const T*>(a.data);
  const T* y = reinterpret_cast<const T*>(b.data);
  if (Check && ((!a.step && !std::isnan(*x)) || (!b.step && !std::isnan(*y))))
    return map<T, false>(out, a, b, n, f);  // a single operand that is a number
  if (a.step && b.step) return map<T, true, true, Check>(out, x, y, n, f);
  if (a.step) return map<T, true, false, Check>(out, x, y, n, f);
  if (b.step) return map<T, false, true, Check>(out, x, y, n, f);
  return map<T, false, false, Check>(out, x, y, n, f);
}

// Whether x[i] and y[i] are both NaN for some i < n: which payload survives
// then differs between ATen's vector and scalar loops (for mul, on x86).
template <typename T>
bool two_nans(T* scratch, SliceOperand a, SliceOperand b, int64_t n) {
  return !map<T, true>(scratch, a, b, n, [](T x, T) { return x; });
}

template <typename T, typename F>
bool binary(T* out, SliceOperand a, SliceOperand b, int64_t n, F f) {
  const auto* o = reinterpret_cast<const char*>(out);
  if (o != a.data && o != b.data) return map<T, true>(out, a, b, n, f);
  // In place: the check must come before the inputs are overwritten.
  alignas(64) T scratch[1024];
  for (int64_t i = 0; i < n; i += 1024) {
    const int64_t len = std::min<int64_t>(1024, n - i);
    if (two_nans<T>(scratch, {a.data + a.step * i * sizeof(T), a.step}, {b.data + b.step * i * sizeof(T), b.step}, len))
      return false;
  }
  return map<T, false>(out, a, b, n, f);
}

template <typename T>
bool run_typed(const ExactArithmetic& op, T* out, SliceOperand a, SliceOperand b, int64_t n) {
  const T scalar = T(op.scalar);
  if (!b.data) b = {reinterpret_cast<const char*>(&scalar), 0};  // a Scalar `other`, or unary
  auto unary = [&](auto f) { return map<T, false>(out, a, b, n, [=](T x, T) { return f(x); }); };
  switch (op.kind) {
    case Kind::Add: return binary<T>(out, a, b, n, [](T x, T y) { return x + y; });
    case Kind::Sub: return binary<T>(out, a, b, n, [](T x, T y) { return x - y; });
    case Kind::Mul: return binary<T>(out, a, b, n, [](T x, T y) { return x * y; });
    case Kind::Div: return binary<T>(out, a, b, n, [](T x, T y) { return x / y; });
    case Kind::Neg: return unary([](T x) { return -x; });
    case Kind::Abs: return unary([](T x) { return std::abs(x); });
    case Kind::Reciprocal: return unary([](T x) { return T(1) / x; });
    case Kind::Function:
      TORCH_INTERNAL_ASSERT(a.step == 1, "a library function reads a whole operand");
      vector_math::run(*op.function, op.dtype, reinterpret_cast<char*>(out), a.data, n);
      return true;
    case Kind::Clamp: {
      // max(x, lo) then min(., hi), each keeping x when x is NaN or equal to
      // the bound (so -0.0 stays -0.0), as ATen's kernels do.
      const T lo = T(op.lo.value_or(0)), hi = T(op.hi.value_or(0));
      auto max_lo = [=](T x) { return x < lo ? lo : x; };
      auto min_hi = [=](T x) { return hi < x ? hi : x; };
      if (op.lo && op.hi) return unary([=](T x) { return min_hi(max_lo(x)); });
      if (op.lo) return unary(max_lo);
      return unary(min_hi);
    }
  }
  return true;
}

} // namespace


namespace {

// One copy of the loops per instruction set; flatten inlines them into
// each. Each member is one IEEE operation or a choice per element, so the
// vector width changes no result. AVX512 here is ATen's AVX512 capability:
// F, DQ, BW and VL (without DQ, GCC spells a comparison's mask out lane by
// lane).
inline bool run_any(const ExactArithmetic& op, char* out, SliceOperand self, SliceOperand other, int64_t n) {
  if (op.dtype == at::kFloat) return run_typed<float>(op, reinterpret_cast<float*>(out), self, other, n);
  return run_typed<double>(op, reinterpret_cast<double*>(out), self, other, n);
}
using RunExact = bool (*)(const ExactArithmetic&, char*, SliceOperand, SliceOperand, int64_t);
__attribute__((target("avx512f,avx512dq,avx512bw,avx512vl"), flatten)) bool run_avx512(
    const ExactArithmetic& op, char* out, SliceOperand self, SliceOperand other, int64_t n) {
  return run_any(op, out, self, other, n);
}
__attribute__((target("avx2"), flatten)) bool run_avx2(
    const ExactArithmetic& op, char* out, SliceOperand self, SliceOperand other, int64_t n) {
  return run_any(op, out, self, other, n);
}
__attribute__((flatten)) bool run_sse2(const ExactArithmetic& op, char* out, SliceOperand self, SliceOperand other,
                                       int64_t n) {
  return run_any(op, out, self, other, n);
}

} // namespace

bool run_exact(const ExactArithmetic& op, char* out, SliceOperand self, SliceOperand other, int64_t n) {
  static const RunExact run = [] {
    const std::string isa = at::get_cpu_capability();
    return isa == "AVX512" ? run_avx512 : isa == "AVX2" ? run_avx2 : run_sse2;
  }();
  return run(op, out, self, other, n);
}

// 16-byte stores (SSE2, every x86-64): write-combining merges them into whole
// lines as it would wider ones.
void stream_copy(char* to, const char* from, size_t bytes) {
  const size_t head = std::min<size_t>(bytes, (16 - uintptr_t(to) % 16) % 16);
  std::memcpy(to, from, head);
  size_t i = head;
  for (; i + 16 <= bytes; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(to + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i)));
  std::memcpy(to + i, from + i, bytes - i);
}

void end_streaming() { _mm_sfence(); }

void run_with_aten(const ExactArithmetic& op, char* out, SliceOperand self, SliceOperand other, int64_t n) {
  auto tensor = [&](const char* data, int64_t step) {
    const auto options = at::TensorOptions().dtype(op.dtype);
    return step ? at::from_blob(const_cast<char*>(data), {n}, options) : at::from_blob(const_cast<char*>(data), {}, options);
  };
  at::Tensor result = tensor(out, 1), a = tensor(self.data, self.step);
  at::Tensor b = other.data ? tensor(other.data, other.step) : at::scalar_tensor(op.scalar, at::TensorOptions().dtype(op.dtype));
  switch (op.kind) {
    case Kind::Add: at::add_out(result, a, b); break;
    case Kind::Sub: at::sub_out(result, a, b); break;
    case Kind::Mul: at::mul_out(result, a, b); break;
    case Kind::Div: at::div_out(result, a, b); break;
    default: TORCH_INTERNAL_ASSERT(false, "only binary kinds decline");
  }
}

} // namespace torchneuron
