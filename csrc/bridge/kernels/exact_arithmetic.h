// Members of a fused group that need no ATen kernel, because fusion's own
// loops compute every element bit for bit as unfused execution does (ATen's
// vector and scalar kernels, or the device's own), NaN payloads and signed
// zeros included:
// * float and double arithmetic whose every result element is one correctly
//   rounded IEEE operation (add, sub, mul, div, reciprocal) or a choice
//   between an operand and a bound (neg, abs, relu, clamp). Not sqrt: ATen's
//   is not correctly rounded (a vector approximation).
// * sigmoid, tanh, exp, log, sqrt, sin, erf, ...: by the very math-library
//   calls ATen's kernels make, each checked against ATen once per process, or
//   by the device's own function (float tanh under TORCHNEURON_DEVICE_TANH=1;
//   vector_math.h).
// A fused group (../fusion/) runs a run of them slice by slice in L1 with its own loops,
// instead of one boxed call (and TensorIterator) per member and piece.
// Everything else, and these operations with type promotion, an alpha other
// than 1 or a broadcast row, stays with ATen's kernels.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "vector_math.h"

namespace torchneuron {

struct ExactArithmetic {
  enum class Kind : uint8_t { Add, Sub, Mul, Div, Neg, Abs, Clamp, Reciprocal, Function };
  Kind kind;
  c10::ScalarType dtype;  // kFloat or kDouble: of every operand but scalars
  // Where the tensor operands are: an index into the call's args, or -1 for
  // the call's result; `other` is -1 for unary kinds and a Scalar `other`.
  int self, other = -1, out;
  // A Scalar `other` and the clamp bounds (relu: lo = 0), already converted
  // to the dtype as ATen converts them (exact in a double).
  double scalar = 0;
  std::optional<double> lo, hi;
  const vector_math::Unary* function = nullptr;  // Kind::Function
};

// One operand over a slice: `n` elements from `data`, or one element
// repeated (`step` 0).
struct SliceOperand {
  const char* data;
  int64_t step;  // 1 or 0, in elements
};

// out[i] = op(self[i], other[i]) for i < n; `other.data` is null for a
// unary kind or a Scalar `other`. Returns false when some element has two
// NaN operands: which payload survives then differs between ATen's vector
// and scalar loops (for mul, on x86), so only ATen's kernel run on the same
// slice (run_with_aten) reproduces it. `out` may be partly written then, but
// never when it is an input.
bool run_exact(const ExactArithmetic& op, char* out, SliceOperand self, SliceOperand other, int64_t n);
void run_with_aten(const ExactArithmetic& op, char* out, SliceOperand self, SliceOperand other, int64_t n);

// A run of exact members that forms a chain, or more generally a DAG: each
// member reads the value the one before it produced (`Previous`), a value an
// earlier member of the chain produced (`Held`: operands reused, residual
// adds), or operands that no member of the chain writes. run_chain then keeps
// every value in registers or in a chunk-sized buffer in L1, one chunk of
// elements at a time, and reads and writes memory in one continuous pass, as
// a single ATen kernel would, instead of one pass over an L1 slice per member.
struct ChainOperand {
  enum Kind : uint8_t { None, Previous, Held, Single, Memory, Slice } kind = None;
  // Single: the element; Memory: element 0 of the iteration space; Slice: a
  // scratch slot holding the current slice, from its first element.
  const char* data = nullptr;
  int step = -1;  // Held: the chain's step that produced it
};
struct ChainStep {
  const ExactArithmetic* op;
  ChainOperand self, other;   // `other` None: unary, or op->scalar
  char* out = nullptr;        // as a Memory or Slice operand; null: only later steps read it
  bool out_in_slice = false;  // `out` is a scratch slot holding the current slice
  bool stream = false;        // `out` is written with non-temporal stores
};
// Elements a chunk of run_chain holds in registers (by the instruction set,
// isa.h).
int64_t chain_chunk(c10::ScalarType dtype);
// A chain compiled once per fused group into micro-ops (exact_chain.cpp).
struct ChainProgram {
  // acc op= an operand from memory (checked for two NaNs) or a number that
  // is not NaN: the common step, one micro-op that needs no `arg`.
  enum class Code : uint8_t {
    LoadAcc, LoadArg, SplatAcc, SplatArg, ArgFromAcc, Check,
    Add, Sub, Mul, Div, Neg, Abs, Reciprocal, ClampLo, ClampHi, Sigmoid, Tanh, Hold, End,
    AddLoaded, SubLoaded, MulLoaded, DivLoaded, AddSplat, SubSplat, MulSplat, DivSplat,
    AccFromHeld, ArgFromHeld };
  struct MicroOp {
    Code code;
    bool in_slice;      // `data` is a scratch slot holding the current slice
    int8_t held;        // Hold: into held[held]; *FromHeld: from it
    double value;       // *Splat: the number; Clamp*: the bound (exact in the dtype)
    const char* data;   // Load*, *Loaded: element 0 of the iteration space, or of the slice
  };
  struct Output {
    char* data;
    bool in_slice, stream;
    int8_t held;  // the held value it stores
  };
  static constexpr size_t kMaxHeld = 16;  // values held per chunk: a chain's members at most
  c10::ScalarType dtype = at::kFloat;
  std::vector<MicroOp> ops;
  std::vector<Output> outputs;
  bool empty() const { return ops.empty(); }
};
// `steps` must form a chain (chain_of in ../fusion/execution.cpp): members of
// one dtype, float or double.
ChainProgram compile_chain(const std::vector<ChainStep>& steps);
// Runs the chain over whole chunks of elements [begin, begin + n) of the
// slice starting at `slice` and returns how many it computed: up to the
// first chunk in which some element has two NaN operands (run_exact's reason
// to decline; nothing of that chunk is written), or the last whole chunk.
// The caller computes the rest.
int64_t run_chain(const ChainProgram& program, int64_t slice, int64_t begin, int64_t n);

// Copies a slice computed in L1 to memory with non-temporal stores: a result
// that leaves the cache before anyone reads it is then written without first
// being read into the cache (read for ownership), a quarter of what a chain
// of two inputs and one output moves. `end_streaming` orders these stores
// before anything the thread does next, such as finishing the task.
void stream_copy(char* to, const char* from, size_t bytes);
void end_streaming();

} // namespace torchneuron
