// The device's own loops, written once over one instruction set's vector
// operations `S<T>` (float and double) and compiled by each level's
// translation unit (isa_avx512.cpp, isa_avx2.cpp, isa_portable.cpp) for that
// level alone. Included after the unit's target pragma, inside an anonymous
// namespace: each unit's copies are its own, so no inline function compiled
// for one level can stand in for another's at link time.
//
// S<T> gives: V (a vector) and lanes; Mask, none(), two_nans(m, a, b) (m or
// "both a and b are NaN" per lane), either_nan(m, a, b) (m or "a or b is
// NaN") and any(m); load, store(p, v, stream),
// splat; add, sub, mul, div (single IEEE operations); flip_sign, clear_sign;
// max(bound, a) and min(bound, a), returning a when either is NaN or both
// are zeros (x86's maxps and minps with a second); exp, the exp ATen's vector
// sigmoid calls at this level; fence(), ordering non-temporal stores. S<float> also gives
// tanh, the device's own (tanh.h); `chain_vectors` is how many vectors a chunk of
// a chain holds in registers.
//
// Every loop computes each element with the same operations whatever its
// position or the length of the call, so any cut of the work gives the same
// bits.
//
// Included once per level's unit, inside namespace torchneuron::isa, after
// S<T> and chain_vectors and after the unit's includes (<algorithm>, <cmath>,
// <cstring>, <type_traits>, exact_arithmetic.h): nothing here may be compiled
// for the baseline by an earlier include.

namespace {

using Kind = ExactArithmetic::Kind;

// ---------------------------------------------------------------- exact arithmetic
// out[i] = f(x[i], y[i]) for i < n, where a `Full` operand steps through
// memory and a single one (step 0) is read once. With `Check`, returns
// false if some element had two NaN operands; the caller then has ATen
// recompute the slice, so `out` must not coincide with an input. Scalar
// code that GCC vectorizes for the level's instruction set (an int
// accumulates the check: GCC leaves a bool reduction scalar). Each member is
// one IEEE operation or a choice per element, so the vector width changes no
// result.
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

// flatten: every loop above is compiled into this level's function.
__attribute__((flatten)) bool run_exact_here(const ExactArithmetic& op, char* out, SliceOperand self,
                                             SliceOperand other, int64_t n) {
  if (op.dtype == at::kFloat) return run_typed<float>(op, reinterpret_cast<float*>(out), self, other, n);
  return run_typed<double>(op, reinterpret_cast<double*>(out), self, other, n);
}

// ---------------------------------------------------------------- functions
// ATen's vector sigmoid: 1 / (exp(-x) + 1), where the negation flips the sign
// bit (NaNs included).
template <typename A>
__attribute__((always_inline)) inline typename A::V sigmoid(typename A::V a) {
  const typename A::V one = A::splat(1);
  return A::div(one, A::add(A::exp(A::flip_sign(a)), one));
}

// ATen's vectorized loop: pairs of vectors, then the remainder in scalar code
// with libm's exp, in ATen's scalar form.
template <typename T>
void sigmoid_here(T* out, const T* x, int64_t n) {
  using A = S<T>;
  constexpr int64_t lanes = A::lanes;
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes)
    for (int64_t k = i; k < i + 2 * lanes; k += lanes) A::store(out + k, sigmoid<A>(A::load(x + k)), false);
  for (; i < n; ++i) out[i] = T(1) / (T(1) + std::exp(-x[i]));
}

// Whether sigmoid can run here as ATen runs it: the library exp it needs is
// linked (S<T>::library_present), and an exp written inline equals the
// library's (S<float>::library_exp), bit for bit, on every 4093rd float
// (every exponent, sign and NaN class; all 2^32 agreed when written).
template <typename A>
bool inline_exp_matches_library() {
  for (uint64_t base = 0; base < (uint64_t(1) << 32); base += A::lanes * 4093) {
    uint32_t bits[A::lanes];
    for (uint32_t i = 0; i < A::lanes; ++i) bits[i] = uint32_t(base + i * 4093);
    float mine[A::lanes], library[A::lanes];
    const typename A::V x = A::load(reinterpret_cast<const float*>(bits));
    A::store(mine, A::exp(x), false);
    A::store(library, A::library_exp(x), false);
    if (std::memcmp(mine, library, sizeof mine) != 0) return false;
  }
  return true;
}

bool sigmoid_ready_here(bool is_double) {
  using A = S<float>;
  if (is_double) return S<double>::library_present();
  if constexpr (A::inline_exp) return A::library_present() && inline_exp_matches_library<A>();
  return A::library_present();
}

// The device's tanh over whole vectors, then the tail: the same arithmetic on
// a vector holding the elements that exist.
void tanh_here(float* out, const float* x, int64_t n) {
  using A = S<float>;
  int64_t i = 0;
  for (; i + A::lanes <= n; i += A::lanes) A::store(out + i, A::tanh(A::load(x + i)), false);
  if (i < n) {
    float tail[A::lanes] = {};
    std::memcpy(tail, x + i, (n - i) * sizeof(float));
    A::store(tail, A::tanh(A::load(tail)), false);
    std::memcpy(out + i, tail, (n - i) * sizeof(float));
  }
}

// ---------------------------------------------------------------- streaming
// Copies with non-temporal stores (exact_arithmetic.h's stream_copy) and
// orders them before what the thread does next (end_streaming).
void stream_copy_here(char* to, const char* from, size_t bytes) {
  using A = S<float>;
  constexpr size_t vector = A::lanes * sizeof(float);
  const size_t head = std::min<size_t>(bytes, (vector - uintptr_t(to) % vector) % vector);
  std::memcpy(to, from, head);
  size_t i = head;
  for (; i + vector <= bytes; i += vector)
    A::store(reinterpret_cast<float*>(to + i), A::load(reinterpret_cast<const float*>(from + i)), true);
  std::memcpy(to + i, from + i, bytes - i);
}

void end_streaming_here() { S<float>::fence(); }

// ---------------------------------------------------------------- bfloat16
// nki_host.h's round_to_bf16: float32 to bfloat16 bits as ml_dtypes' cast
// (nearest, ties to even; NaN becomes the quiet NaN of its sign). Integer
// operations only, which GCC vectorizes: every level gives the same bits.
void round_to_bf16_here(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &src[i], sizeof u);
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    dst[i] = static_cast<uint16_t>(nan ? ((u >> 16) & 0x8000u) | 0x7fc0u : rounded);
  }
}

// ---------------------------------------------------------------- register chains
// run_chain (exact_arithmetic.h): a chain of exact members computed in
// registers, a chunk of `chain_vectors` vectors at a time. Every operation is
// the single IEEE operation, or the choice, that run_exact's loops (and ATen's
// kernels) make per element, or the very function unfused execution computes
// (sigmoid as ATen's vector loop, the device's own tanh where selected), so the results are the
// same bits.
//
// The chain runs as threaded code: a program of micro-ops over two sets of
// registers, the value (`acc`) and the step's other operand (`arg`), each
// micro-op ending in a jump to the next one's label. The common step, acc op=
// a loaded operand or a number, is one micro-op that leaves `arg` alone:
// with 16 registers `arg` lives in memory, and filling it cost more than the
// operation. A loop with a switch per
// step made GCC spill the registers around the switch; threaded code keeps
// them in registers. Labels as values are a GCC extension, which Clang has too.
// A value that a later step reads again (a DAG: an operand reused, a residual
// add) is held in a chunk-sized buffer, in L1, and read back into `acc` or
// `arg` where it is needed.

// Memory operands are prefetched this far ahead, a chunk's lines at a time:
// a chain's compute fills the core's window, leaving few loads in flight.
constexpr int64_t kPrefetchBytes = 4096;

// A chunk's vectors. The loops are unrolled, so that GCC keeps them in
// registers.
template <typename V>
struct Chunk {
  V v[chain_vectors];
  static __attribute__((always_inline)) Chunk all(V x) {
    Chunk c;
#pragma GCC unroll 16
    for (int i = 0; i < chain_vectors; ++i) c.v[i] = x;
    return c;
  }
  template <typename F>
  __attribute__((always_inline)) Chunk map(F f) const {
    Chunk c;
#pragma GCC unroll 16
    for (int i = 0; i < chain_vectors; ++i) c.v[i] = f(v[i]);
    return c;
  }
  template <typename F>
  __attribute__((always_inline)) Chunk map(F f, const Chunk& o) const {
    Chunk c;
#pragma GCC unroll 16
    for (int i = 0; i < chain_vectors; ++i) c.v[i] = f(v[i], o.v[i]);
    return c;
  }
};

using Code = ChainProgram::Code;

// Accumulates into `two_nans` "both are NaN" of a chunk and an operand's:
// "either is NaN" first, one comparison a vector, since NaNs are rare. (A
// function: as a lambda capturing `two_nans`, GCC 12 stops with an internal
// error on the portable level's vector types.)
template <typename A, typename Q>
__attribute__((always_inline)) inline typename A::Mask with_two_nans(typename A::Mask two_nans, const Q& acc,
                                                                     const Q& arg) {
  typename A::Mask either = A::none();
#pragma GCC unroll 16
  for (int k = 0; k < chain_vectors; ++k) either = A::either_nan(either, acc.v[k], arg.v[k]);
  if (A::any(either))
#pragma GCC unroll 16
    for (int k = 0; k < chain_vectors; ++k) two_nans = A::two_nans(two_nans, acc.v[k], arg.v[k]);
  return two_nans;
}

template <typename T>
int64_t run_chain_typed(const ChainProgram& program, int64_t slice, int64_t begin, int64_t n) {
  using A = S<T>;
  using V = typename A::V;
  using Q = Chunk<V>;
  constexpr int64_t lanes = A::lanes, chunk = chain_vectors * lanes, line_bytes = 64;
  constexpr int lines = int(chunk * sizeof(T) / line_bytes);
  // By Code.
  static const void* const labels[] = {&&load_acc, &&load_arg, &&splat_acc, &&splat_arg, &&arg_from_acc, &&check,
                                       &&add, &&sub, &&mul, &&div, &&neg, &&abs, &&reciprocal, &&clamp_lo,
                                       &&clamp_hi, &&sigmoid, &&tanh, &&hold, &&end, &&add_loaded, &&sub_loaded,
                                       &&mul_loaded, &&div_loaded, &&add_splat, &&sub_splat, &&mul_splat,
                                       &&div_splat, &&acc_from_held, &&arg_from_held};
  static_assert(sizeof(labels) / sizeof(labels[0]) == size_t(Code::ArgFromHeld) + 1);
  // A memory or scratch operand's chunk, prefetching ahead.
  auto load = [&](const ChainProgram::MicroOp& op, int64_t i) __attribute__((always_inline)) {
    const T* p = reinterpret_cast<const T*>(op.data) + (op.in_slice ? i - slice : i);
    const char* ahead = reinterpret_cast<const char*>(p) + kPrefetchBytes;
    for (int line = 0; line < lines; ++line) __builtin_prefetch(ahead + line_bytes * line, 0, 3);
    Q q;
#pragma GCC unroll 16
    for (int k = 0; k < chain_vectors; ++k) q.v[k] = A::load(p + k * lanes);
    return q;
  };
  // Values later steps read (a DAG's reused ones) and results bound for
  // memory, stored once the chunk is known to be exact: in L1.
  Q held[ChainProgram::kMaxHeld];
  Q acc{}, arg{};
  typename A::Mask two_nans = A::none();
  const ChainProgram::MicroOp* pc = nullptr;
  int64_t i = begin;
#define TORCHNEURON_NEXT goto* labels[size_t((++pc)->code)]
  for (; i + chunk <= begin + n; i += chunk) {
    pc = program.ops.data();
    goto* labels[size_t(pc->code)];
  load_acc:
    acc = load(*pc, i);
    TORCHNEURON_NEXT;
  load_arg:
    arg = load(*pc, i);
    TORCHNEURON_NEXT;
  splat_acc:
    acc = Q::all(A::splat(T(pc->value)));
    TORCHNEURON_NEXT;
  splat_arg:
    arg = Q::all(A::splat(T(pc->value)));
    TORCHNEURON_NEXT;
  arg_from_acc:
    arg = acc;
    TORCHNEURON_NEXT;
  check:
    two_nans = with_two_nans<A>(two_nans, acc, arg);
    TORCHNEURON_NEXT;
  add:
    acc = acc.map(A::add, arg);
    TORCHNEURON_NEXT;
  sub:
    acc = acc.map(A::sub, arg);
    TORCHNEURON_NEXT;
  mul:
    acc = acc.map(A::mul, arg);
    TORCHNEURON_NEXT;
  div:
    acc = acc.map(A::div, arg);
    TORCHNEURON_NEXT;
  neg:
    acc = acc.map(A::flip_sign);
    TORCHNEURON_NEXT;
  abs:
    acc = acc.map(A::clear_sign);
    TORCHNEURON_NEXT;
  reciprocal:
    acc = acc.map([](V a) __attribute__((always_inline)) { return A::div(A::splat(T(1)), a); });
    TORCHNEURON_NEXT;
  // As run_exact: x < lo ? lo : x, which keeps x when it is NaN or equal to
  // the bound (-0.0 stays -0.0): max and min with x second.
  clamp_lo: {
    const V lo = A::splat(T(pc->value));
    acc = acc.map([lo](V a) __attribute__((always_inline)) { return A::max(lo, a); });
    TORCHNEURON_NEXT;
  }
  clamp_hi: {
    const V hi = A::splat(T(pc->value));
    acc = acc.map([hi](V a) __attribute__((always_inline)) { return A::min(hi, a); });
    TORCHNEURON_NEXT;
  }
  sigmoid:  // as sigmoid_here's vector loop; chained only where vector_math found it ATen's
    acc = acc.map(sigmoid<A>);
    TORCHNEURON_NEXT;
  tanh:  // the device's own (tanh.h), which chain_of chains for float only, where selected
    if constexpr (std::is_same_v<T, float>) acc = acc.map(A::tanh);
    TORCHNEURON_NEXT;
  hold:
    held[pc->held] = acc;
    TORCHNEURON_NEXT;
  acc_from_held:
    acc = held[pc->held];
    TORCHNEURON_NEXT;
  arg_from_held:
    arg = held[pc->held];
    TORCHNEURON_NEXT;
  // acc op= a loaded operand, checked, or a number: `arg` is left alone.
#define TORCHNEURON_FOLDED(name, F)                                                    \
  name##_loaded : {                                                                    \
    const Q loaded = load(*pc, i);                                                     \
    two_nans = with_two_nans<A>(two_nans, acc, loaded);                                \
    acc = acc.map(F, loaded);                                                          \
    TORCHNEURON_NEXT;                                                                  \
  }                                                                                    \
  name##_splat : {                                                                     \
    const V number = A::splat(T(pc->value));                                           \
    acc = acc.map([number](V a) __attribute__((always_inline)) { return F(a, number); }); \
    TORCHNEURON_NEXT;                                                                  \
  }
  TORCHNEURON_FOLDED(add, A::add)
  TORCHNEURON_FOLDED(sub, A::sub)
  TORCHNEURON_FOLDED(mul, A::mul)
  TORCHNEURON_FOLDED(div, A::div)
#undef TORCHNEURON_FOLDED
  end:
    if (A::any(two_nans)) break;
    for (size_t k = 0; k < program.outputs.size(); ++k) {
      const ChainProgram::Output& o = program.outputs[k];
      T* out = reinterpret_cast<T*>(o.data) + (o.in_slice ? i - slice : i);
      const bool stream = o.stream && reinterpret_cast<uintptr_t>(out) % sizeof(V) == 0;
#pragma GCC unroll 16
      for (int j = 0; j < chain_vectors; ++j) A::store(out + j * lanes, held[o.held].v[j], stream);
    }
  }
#undef TORCHNEURON_NEXT
  return i - begin;
}

int64_t run_chain_here(const ChainProgram& program, int64_t slice, int64_t begin, int64_t n) {
  return program.dtype == at::kFloat ? run_chain_typed<float>(program, slice, begin, n)
                                     : run_chain_typed<double>(program, slice, begin, n);
}

} // namespace
