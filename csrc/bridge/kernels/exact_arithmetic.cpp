#include "exact_arithmetic.h"

#include <ATen/ops/add.h>
#include <ATen/ops/div.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/sub.h>

#include "isa.h"

namespace torchneuron {

using Kind = ExactArithmetic::Kind;

// The loops are the instruction set's (isa.h, simd_loops.h).
bool run_exact(const ExactArithmetic& op, char* out, SliceOperand self, SliceOperand other, int64_t n) {
  return isa::kernels().run_exact(op, out, self, other, n);
}

void stream_copy(char* to, const char* from, size_t bytes) { isa::kernels().stream_copy(to, from, bytes); }

void end_streaming() { isa::kernels().end_streaming(); }

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
