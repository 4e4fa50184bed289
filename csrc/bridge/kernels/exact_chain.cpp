// compile_chain, and the dispatch of run_chain (exact_arithmetic.h) to the
// loops of this process's instruction set (isa.h; the chain engine is
// simd_loops.h's run_chain_typed).
#include <cmath>

#include "exact_arithmetic.h"
#include "isa.h"

namespace torchneuron {
namespace {

using Kind = ExactArithmetic::Kind;
using Code = ChainProgram::Code;

} // namespace

int64_t chain_chunk(c10::ScalarType dtype) {
  return isa::kernels().chain_bytes / int64_t(c10::elementSize(dtype));
}

ChainProgram compile_chain(const std::vector<ChainStep>& steps) {
  ChainProgram program;
  const c10::ScalarType dtype = program.dtype = steps.front().op->dtype;
  // The held value (a chunk kept in L1 for the rest of the chunk's pass) of
  // each step that later steps read as `Held` or that goes to memory.
  std::vector<int8_t> held(steps.size(), -1);
  int8_t holds = 0;
  for (const ChainStep& step : steps)
    for (const ChainOperand* o : {&step.self, &step.other})
      if (o->kind == ChainOperand::Held && held[o->step] < 0) held[o->step] = holds++;
  for (size_t k = 0; k < steps.size(); ++k)
    if (steps[k].out && held[k] < 0) held[k] = holds++;
  TORCH_INTERNAL_ASSERT(size_t(holds) <= ChainProgram::kMaxHeld, "compile_chain: too many held values");
  auto emit = [&](Code code, double value = 0, const ChainOperand* o = nullptr, int8_t h = -1) {
    ChainProgram::MicroOp op{code, false, h, value, nullptr};
    if (o) op.data = o->data, op.in_slice = o->kind == ChainOperand::Slice;
    program.ops.push_back(op);
  };
  auto in_memory = [](const ChainOperand& o) {
    return o.kind == ChainOperand::Memory || o.kind == ChainOperand::Slice;
  };
  // A number operand: a single element, read now (no member of the group
  // writes it), or the op's Scalar.
  auto number = [&](const ChainOperand& o, const ExactArithmetic& op) {
    if (o.kind != ChainOperand::Single) return op.scalar;
    return dtype == at::kFloat ? double(*reinterpret_cast<const float*>(o.data))
                               : *reinterpret_cast<const double*>(o.data);
  };
  // An operand into acc or arg, from memory, from a held value or broadcast;
  // false if it is a number (then no element has two NaN operands).
  auto place = [&](const ChainOperand& o, const ExactArithmetic& op, Code load, Code from_held, Code splat) {
    if (in_memory(o)) {
      emit(load, 0, &o);
      return true;
    }
    if (o.kind == ChainOperand::Held) {
      emit(from_held, 0, nullptr, held[o.step]);
      return true;
    }
    const double v = number(o, op);
    emit(splat, v);
    return std::isnan(v);
  };
  for (size_t k = 0; k < steps.size(); ++k) {
    const ChainStep& step = steps[k];
    const ExactArithmetic& op = *step.op;
    const int binary = op.kind == Kind::Add ? 1 : op.kind == Kind::Sub ? 2 : op.kind == Kind::Mul ? 3
                     : op.kind == Kind::Div ? 4 : 0;  // and the op's place among the folded codes, plus one
    const bool folds = binary && step.self.kind == ChainOperand::Previous &&
                       (in_memory(step.other) || (step.other.kind != ChainOperand::Previous &&
                                                  step.other.kind != ChainOperand::Held &&
                                                  !std::isnan(number(step.other, op))));
    if (folds && in_memory(step.other)) {
      emit(Code(int(Code::AddLoaded) + binary - 1), 0, &step.other);
    } else if (folds) {
      emit(Code(int(Code::AddSplat) + binary - 1), number(step.other, op));
    } else {
      bool x_nan = true, y_nan = true;  // may this operand be NaN
      if (binary && step.other.kind == ChainOperand::Previous) emit(Code::ArgFromAcc);
      if (step.self.kind != ChainOperand::Previous)
        x_nan = place(step.self, op, Code::LoadAcc, Code::AccFromHeld, Code::SplatAcc);
      if (binary && step.other.kind != ChainOperand::Previous)
        y_nan = place(step.other, op, Code::LoadArg, Code::ArgFromHeld, Code::SplatArg);
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
    }
    if (held[k] >= 0) emit(Code::Hold, 0, nullptr, held[k]);
    if (step.out) program.outputs.push_back({step.out, step.out_in_slice, step.stream, held[k]});
  }
  emit(Code::End);
  return program;
}

int64_t run_chain(const ChainProgram& program, int64_t slice, int64_t begin, int64_t n) {
  TORCH_INTERNAL_ASSERT(!program.empty(), "run_chain: an empty chain");
  return isa::kernels().run_chain(program, slice, begin, n);
}

} // namespace torchneuron
