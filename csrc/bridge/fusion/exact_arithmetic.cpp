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

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <string>
#include <unordered_map>

namespace torchneuron {
namespace {

using Kind = ExactArithmetic::Kind;

const std::unordered_map<std::string, Kind>& kinds() {
  static const std::unordered_map<std::string, Kind> k = {
      {"add", Kind::Add}, {"sub", Kind::Sub}, {"mul", Kind::Mul},       {"div", Kind::Div},
      {"neg", Kind::Neg}, {"abs", Kind::Abs}, {"relu", Kind::Clamp},    {"clamp", Kind::Clamp},
      {"clamp_min", Kind::Clamp}, {"clamp_max", Kind::Clamp}, {"reciprocal", Kind::Reciprocal}};
  return k;
}

// A real Scalar (ATen wraps it as a double, int64 or bool tensor), or a bound
// that is a number: clamp with a NaN bound fills NaN, which is left to ATen.
bool real(const c10::Scalar& s) {
  return !s.isComplex() && !(s.isFloatingPoint() && std::isnan(s.toDouble()));
}

// A Scalar `other` as TensorIterator converts the number ATen wraps it in.
template <typename T>
T wrapped(const c10::Scalar& s) {
  return s.isFloatingPoint() ? T(s.toDouble()) : s.isBoolean() ? T(s.toBool()) : T(s.toLong());
}

// A clamp bound as ATen's kernel converts it (Scalar::to, which refuses an
// overflow: then nullopt, and ATen raises it).
std::optional<double> bound(const c10::Scalar& s, c10::ScalarType dtype) {
  try {
    return dtype == at::kFloat ? double(s.to<float>()) : s.to<double>();
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}

template <typename T, typename F>
inline void map(T* out, SliceOperand a, SliceOperand b, int64_t n, F f) {
  const T* x = reinterpret_cast<const T*>(a.data);
  const T* y = reinterpret_cast<const T*>(b.data);
  if (a.step && b.step) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(x[i], y[i]);
  } else if (a.step) {
    const T v = *y;
    for (int64_t i = 0; i < n; ++i) out[i] = f(x[i], v);
  } else {
    const T u = *x;
    if (b.step) {
      for (int64_t i = 0; i < n; ++i) out[i] = f(u, y[i]);
    } else {
      const T v = f(u, *y);
      for (int64_t i = 0; i < n; ++i) out[i] = v;
    }
  }
}

// Whether x[i] and y[i] are both NaN for some i < n, or x[i] is for a NaN
// `y` (step 0). Written with vector types: GCC leaves a bool reduction over
// float comparisons scalar.
template <typename T>
bool two_nans(SliceOperand a, SliceOperand b, int64_t n) {
  const T* x = reinterpret_cast<const T*>(a.data);
  const T* y = reinterpret_cast<const T*>(b.data);
  if (!a.step && !b.step) return std::isnan(*x) && std::isnan(*y);
  if (!a.step) std::swap(x, y);  // x: the full operand
  const bool single = !a.step || !b.step;
  if (single && !std::isnan(*y)) return false;
  typedef T Vec __attribute__((vector_size(32)));
  constexpr int64_t lanes = 32 / sizeof(T);
  decltype(Vec{} != Vec{}) found{};
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    Vec u, v;
    std::memcpy(&u, x + i, sizeof(Vec));
    if (single) {
      found |= u != u;
    } else {
      std::memcpy(&v, y + i, sizeof(Vec));
      found |= (u != u) & (v != v);
    }
  }
  bool any = false;
  for (int64_t k = 0; k < lanes; ++k) any |= found[k] != 0;
  for (; i < n; ++i) any |= std::isnan(x[i]) && (single || std::isnan(y[i]));
  return any;
}

template <typename T>
bool run_typed(const ExactArithmetic& op, T* out, SliceOperand a, SliceOperand b, int64_t n) {
  const T scalar = T(op.scalar);
  if (!b.data) b = {reinterpret_cast<const char*>(&scalar), 0};  // a Scalar `other`, or unary
  switch (op.kind) {
    case Kind::Add:
    case Kind::Sub:
    case Kind::Mul:
    case Kind::Div:
      if (two_nans<T>(a, b, n)) return false;
      break;
    default:
      break;
  }
  switch (op.kind) {
    case Kind::Add: map<T>(out, a, b, n, [](T x, T y) { return x + y; }); break;
    case Kind::Sub: map<T>(out, a, b, n, [](T x, T y) { return x - y; }); break;
    case Kind::Mul: map<T>(out, a, b, n, [](T x, T y) { return x * y; }); break;
    case Kind::Div: map<T>(out, a, b, n, [](T x, T y) { return x / y; }); break;
    case Kind::Neg: map<T>(out, a, b, n, [](T x, T) { return -x; }); break;
    case Kind::Abs: map<T>(out, a, b, n, [](T x, T) { return std::abs(x); }); break;
    case Kind::Reciprocal: map<T>(out, a, b, n, [](T x, T) { return T(1) / x; }); break;
    case Kind::Function:
      TORCH_INTERNAL_ASSERT(a.step == 1, "a library function reads a whole operand");
      vector_math::run(*op.function, op.dtype, reinterpret_cast<char*>(out), a.data, n);
      break;
    case Kind::Clamp:
      // max(x, lo) then min(., hi), each keeping x when x is NaN or equal to
      // the bound (so -0.0 stays -0.0), as ATen's kernels do.
      if (op.lo && op.hi) {
        const T lo = T(*op.lo), hi = T(*op.hi);
        map<T>(out, a, b, n, [=](T x, T) {
          const T t = x < lo ? lo : x;
          return hi < t ? hi : t;
        });
      } else if (op.lo) {
        const T lo = T(*op.lo);
        map<T>(out, a, b, n, [=](T x, T) { return x < lo ? lo : x; });
      } else {
        const T hi = T(*op.hi);
        map<T>(out, a, b, n, [=](T x, T) { return hi < x ? hi : x; });
      }
      break;
  }
  return true;
}

} // namespace

std::optional<ExactArithmetic> exact_arithmetic_of(const ElementwiseCall& call) {
  const auto& schema = call.op.schema();
  std::string base = schema.name().substr(6);  // after "aten::"
  const bool inplace = !base.empty() && base.back() == '_';
  if (inplace) base.pop_back();
  auto kind = kinds().find(base);
  ExactArithmetic op{kind == kinds().end() ? Kind::Function : kind->second, c10::ScalarType::Undefined, -1, -1, -1};
  auto arg = [&](const char* name) -> const c10::IValue* {
    auto i = schema.argumentIndexWithName(name);
    return i && *i < call.args.size() ? &call.args[*i] : nullptr;
  };
  auto index = [&](const char* name) { return int(*schema.argumentIndexWithName(name)); };
  const c10::IValue* self = arg("self");
  if (!self || !self->isTensor()) return std::nullopt;
  op.self = index("self");
  op.out = inplace ? op.self : arg("out") ? index("out") : -1;
  if (op.out == -1 && call.results.size() != 1) return std::nullopt;
  const at::Tensor& out = op.out == -1 ? call.results[0] : call.args[op.out].toTensor();
  op.dtype = out.scalar_type();
  if (op.dtype != at::kFloat && op.dtype != at::kDouble) return std::nullopt;

  if (const c10::IValue* alpha = arg("alpha");
      alpha && (alpha->toScalar().isBoolean() || !real(alpha->toScalar()) || alpha->toScalar().toDouble() != 1.0))
    return std::nullopt;  // a bool alpha is ATen's error to raise
  if (const c10::IValue* mode = arg("rounding_mode"); mode && !mode->isNone()) return std::nullopt;
  if (const c10::IValue* other = arg("other")) {
    if (other->isTensor()) {
      op.other = index("other");
    } else if (other->isScalar() && real(other->toScalar())) {
      op.scalar = op.dtype == at::kFloat ? wrapped<float>(other->toScalar()) : wrapped<double>(other->toScalar());
    } else {
      return std::nullopt;
    }
  }
  if (base == "relu") op.lo = 0.0;
  for (auto [name, limit] : {std::pair{"min", &op.lo}, std::pair{"max", &op.hi}}) {
    const c10::IValue* v = arg(name);
    if (!v || v->isNone()) continue;
    if (!v->isScalar() || !real(v->toScalar())) return std::nullopt;  // a Tensor bound, a NaN
    *limit = bound(v->toScalar(), op.dtype);
    if (!*limit) return std::nullopt;
  }
  if (op.kind == Kind::Clamp && !op.lo && !op.hi) return std::nullopt;
  if (op.kind == Kind::Function) {
    const at::Tensor& x = call.args[op.self].toTensor();
    if (schema.arguments().size() != (arg("out") ? 2 : 1) || x.scalar_type() != op.dtype || x.numel() != out.numel())
      return std::nullopt;
    op.function = vector_math::like_aten(base, op.dtype);
    if (!op.function) return std::nullopt;
  }

  // No type promotion: every tensor of more than zero dimensions has the
  // result's dtype, and 0-dim ones (which weigh less) are real numbers.
  for (int i : {op.self, op.other}) {
    if (i < 0) continue;
    const at::Tensor& t = call.args[i].toTensor();
    if (t.dim() == 0 ? c10::isComplexType(t.scalar_type()) : t.scalar_type() != op.dtype) return std::nullopt;
  }
  return op;
}

// flatten: the loops are inlined into each clone, so the avx2 one has avx2 loops.
__attribute__((target_clones("avx2", "default"), flatten))
bool run_exact(const ExactArithmetic& op, char* out, SliceOperand self, SliceOperand other, int64_t n) {
  if (op.dtype == at::kFloat) return run_typed<float>(op, reinterpret_cast<float*>(out), self, other, n);
  return run_typed<double>(op, reinterpret_cast<double*>(out), self, other, n);
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
