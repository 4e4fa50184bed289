// compile_chain and run_chain (exact_arithmetic.h): a chain of exact members
// computed in registers, a chunk of eight AVX-512 vectors at a time. Every
// operation is the single IEEE operation, or the choice, that run_exact's
// loops (and ATen's kernels) make per element, or the very function unfused
// execution computes (sigmoid as ATen's vector loop, the device's tanh), so
// the results are the same bits.
//
// The chain runs as threaded code: a program of micro-ops over two sets of
// eight registers, the value (`acc`) and the step's other operand (`arg`),
// each micro-op ending in a jump to the next one's label. A loop with a
// switch per step made GCC spill the registers around the switch and cost
// ~30 cycles per step and chunk; threaded code keeps them in registers
// (one thread, 16K floats in cache: 8 steps of arithmetic 1.24 -> 0.4-0.6
// ns per element). Labels as values are a GCC extension, which Clang has too.
#include <ATen/Version.h>  // get_cpu_capability

#include <immintrin.h>

#include <cmath>
#include <type_traits>
#include <string>

#include "exact_arithmetic.h"
#include "sleef_exp.h"
#include "tanh.h"

namespace torchneuron {
namespace {

using Kind = ExactArithmetic::Kind;
// Vectors per chunk: independent work for the core while one op waits, and
// one dispatch of each micro-op for all of them. Eight keep acc and arg in 16
// of the 32 registers (sixteen spill).
constexpr int kVectors = 8;
// Memory operands are prefetched this far ahead, a chunk's lines at a time:
// a chain's compute fills the core's window, leaving few loads in flight.
constexpr int64_t kPrefetchBytes = 4096;

// The loops below are compiled for ATen's AVX512 capability and only ever
// called where it is present (lambdas included, hence the pragma).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl")
#define TORCHNEURON_AVX512 __attribute__((always_inline)) inline

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
  static TORCHNEURON_AVX512 V max(V bound, V a) { return _mm512_max_ps(bound, a); }
  static TORCHNEURON_AVX512 V min(V bound, V a) { return _mm512_min_ps(bound, a); }
  static TORCHNEURON_AVX512 Mask nan(V a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  static TORCHNEURON_AVX512 V exp(V a) { return exp_like_sleef(a); }  // sigmoid is only chained where
                                                                      // vector_math found it
  static TORCHNEURON_AVX512 V tanh(V a) { return kernels::tanh_float16(a); }
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
  static TORCHNEURON_AVX512 V max(V bound, V a) { return _mm512_max_pd(bound, a); }
  static TORCHNEURON_AVX512 V min(V bound, V a) { return _mm512_min_pd(bound, a); }
  static TORCHNEURON_AVX512 Mask nan(V a) { return _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q); }
  static TORCHNEURON_AVX512 V exp(V a) { return Sleef_expd8_u10(a); }
};

// A chunk's vectors. The loops are unrolled, so that GCC keeps them in
// registers.
template <typename V>
struct Chunk {
  V v[kVectors];
  static TORCHNEURON_AVX512 Chunk all(V x) {
    Chunk c;
#pragma GCC unroll 16
    for (int i = 0; i < kVectors; ++i) c.v[i] = x;
    return c;
  }
  template <typename F>
  TORCHNEURON_AVX512 Chunk map(F f) const {
    Chunk c;
#pragma GCC unroll 16
    for (int i = 0; i < kVectors; ++i) c.v[i] = f(v[i]);
    return c;
  }
  template <typename F>
  TORCHNEURON_AVX512 Chunk map(F f, const Chunk& o) const {
    Chunk c;
#pragma GCC unroll 16
    for (int i = 0; i < kVectors; ++i) c.v[i] = f(v[i], o.v[i]);
    return c;
  }
};

using Code = ChainProgram::Code;

template <typename T>
int64_t run_avx512(const ChainProgram& program, int64_t slice, int64_t begin, int64_t n) {
  using A = Avx512<T>;
  using V = typename A::V;
  using Q = Chunk<V>;
  constexpr int64_t lanes = sizeof(V) / sizeof(T), chunk = kVectors * lanes;
  // By Code.
  static const void* const labels[] = {&&load_acc, &&load_arg, &&splat_acc, &&splat_arg, &&arg_from_acc, &&check,
                                       &&add, &&sub, &&mul, &&div, &&neg, &&abs, &&reciprocal, &&clamp_lo,
                                       &&clamp_hi, &&sigmoid, &&tanh, &&hold, &&end};
  static_assert(sizeof(labels) / sizeof(labels[0]) == size_t(Code::End) + 1);
  // A memory or scratch operand's chunk, prefetching ahead.
  auto load = [&](const ChainProgram::MicroOp& op, int64_t i) {
    const T* p = reinterpret_cast<const T*>(op.data) + (op.in_slice ? i - slice : i);
    const char* ahead = reinterpret_cast<const char*>(p) + kPrefetchBytes;
    for (int line = 0; line < kVectors; ++line) _mm_prefetch(ahead + 64 * line, _MM_HINT_T0);
    Q q;
#pragma GCC unroll 16
    for (int k = 0; k < kVectors; ++k) q.v[k] = A::load(p + k * lanes);
    return q;
  };
  Q held[ChainProgram::kMaxOutputs];  // results bound for memory, stored once the chunk is known to be exact
  Q acc{}, arg{};
  typename A::Mask two_nans = 0;
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
#pragma GCC unroll 16
    for (int k = 0; k < kVectors; ++k) two_nans |= A::nan(acc.v[k]) & A::nan(arg.v[k]);
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
    acc = acc.map([](V a) { return A::div(A::splat(T(1)), a); });
    TORCHNEURON_NEXT;
  // As run_exact: x < lo ? lo : x, which keeps x when it is NaN or equal to
  // the bound (-0.0 stays -0.0). vmaxps and vminps do just that with x second:
  // they return the second operand when either is NaN or both are zeros.
  clamp_lo: {
    const V lo = A::splat(T(pc->value));
    acc = acc.map([lo](V a) { return A::max(lo, a); });
    TORCHNEURON_NEXT;
  }
  clamp_hi: {
    const V hi = A::splat(T(pc->value));
    acc = acc.map([hi](V a) { return A::min(hi, a); });
    TORCHNEURON_NEXT;
  }
  sigmoid:  // as vector_math's loop
    acc = acc.map([](V a) {
      const V one = A::splat(T(1));
      return A::div(one, A::add(A::exp(A::flip_sign(a)), one));
    });
    TORCHNEURON_NEXT;
  tanh:  // the device's own (tanh.h), which chain_of chains for float only
    if constexpr (std::is_same_v<T, float>) acc = acc.map(A::tanh);
    TORCHNEURON_NEXT;
  hold:
    held[pc->output] = acc;
    TORCHNEURON_NEXT;
  end:
    if (two_nans) break;
    for (size_t k = 0; k < program.outputs.size(); ++k) {
      const ChainProgram::Output& o = program.outputs[k];
      T* out = reinterpret_cast<T*>(o.data) + (o.in_slice ? i - slice : i);
      const bool stream = o.stream && reinterpret_cast<uintptr_t>(out) % sizeof(V) == 0;
#pragma GCC unroll 16
      for (int j = 0; j < kVectors; ++j) A::store(out + j * lanes, held[k].v[j], stream);
    }
  }
#undef TORCHNEURON_NEXT
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

ChainProgram compile_chain(const std::vector<ChainStep>& steps) {
  ChainProgram program;
  const c10::ScalarType dtype = program.dtype = steps.front().op->dtype;
  auto emit = [&](Code code, double value = 0, const ChainOperand* o = nullptr) {
    ChainProgram::MicroOp op{code, false, int8_t(program.outputs.size()), value, nullptr};
    if (o) op.data = o->data, op.in_slice = o->kind == ChainOperand::Slice;
    program.ops.push_back(op);
  };
  // An operand into acc or arg, from memory or broadcast; false if it is a
  // number (then no element has two NaN operands).
  auto place = [&](const ChainOperand& o, const ExactArithmetic& op, Code load, Code splat) {
    if (o.kind == ChainOperand::Memory || o.kind == ChainOperand::Slice) {
      emit(load, 0, &o);
      return true;
    }
    // A single element, read now: no member of the group writes it.
    const double v = o.kind != ChainOperand::Single ? op.scalar
                     : dtype == at::kFloat ? double(*reinterpret_cast<const float*>(o.data))
                                           : *reinterpret_cast<const double*>(o.data);
    emit(splat, v);
    return std::isnan(v);
  };
  for (const ChainStep& step : steps) {
    const ExactArithmetic& op = *step.op;
    const bool binary = op.kind == Kind::Add || op.kind == Kind::Sub || op.kind == Kind::Mul || op.kind == Kind::Div;
    bool x_nan = true, y_nan = true;  // may this operand be NaN
    if (binary && step.other.kind == ChainOperand::Previous) emit(Code::ArgFromAcc);
    if (step.self.kind != ChainOperand::Previous) x_nan = place(step.self, op, Code::LoadAcc, Code::SplatAcc);
    if (binary && step.other.kind != ChainOperand::Previous) y_nan = place(step.other, op, Code::LoadArg, Code::SplatArg);
    if (binary && x_nan && y_nan) emit(Code::Check);
    switch (op.kind) {
      case Kind::Add: emit(Code::Add); break;
      case Kind::Sub: emit(Code::Sub); break;
      case Kind::Mul: emit(Code::Mul); break;
      case Kind::Div: emit(Code::Div); break;
      case Kind::Neg: emit(Code::Neg); break;
      case Kind::Abs: emit(Code::Abs); break;
      case Kind::Reciprocal: emit(Code::Reciprocal); break;
      case Kind::Clamp:  // max with lo, then min with hi
        if (op.lo) emit(Code::ClampLo, *op.lo);
        if (op.hi) emit(Code::ClampHi, *op.hi);
        break;
      case Kind::Function:  // chain_of chains no other function
        emit(vector_math::is_sigmoid(*op.function) ? Code::Sigmoid : Code::Tanh);
        break;
    }
    if (step.out) {
      TORCH_INTERNAL_ASSERT(program.outputs.size() < ChainProgram::kMaxOutputs, "compile_chain: too many outputs");
      emit(Code::Hold);
      program.outputs.push_back({step.out, step.out_in_slice, step.stream});
    }
  }
  emit(Code::End);
  return program;
}

int64_t run_chain(const ChainProgram& program, int64_t slice, int64_t begin, int64_t n) {
  TORCH_INTERNAL_ASSERT(has_avx512() && !program.empty(), "run_chain: no loops for this chain");
  return program.dtype == at::kFloat ? run_avx512<float>(program, slice, begin, n) : run_avx512<double>(program, slice, begin, n);
}

} // namespace torchneuron
