#include "own_kernels.h"

#include <ATen/TensorIterator.h>

#include <algorithm>

#include "../math/tanh.h"

namespace torchneuron::ops {
namespace {

enum class Form : uint8_t { Functional, InPlace, Out };

// tanh of float32: the device's tanh over a TensorIterator built as ATen's
// structured kernel builds its own (output allocation and resizing, overlap
// checks), cut into thread ranges as ATen's is. False: ATen's kernel runs.
bool tanh_kernel(Form form, torch::jit::Stack* stack) {
  const size_t args = form == Form::Out ? 2 : 1;
  const at::Tensor& self = (*stack)[stack->size() - args].toTensor();
  at::Tensor out = form == Form::Out ? stack->back().toTensor() : form == Form::InPlace ? self : at::Tensor();
  if (!math::has_own_tanh() || self.scalar_type() != at::kFloat || (out.defined() && out.scalar_type() != at::kFloat))
    return false;
  at::TensorIterator iter = at::TensorIterator::unary_float_op(out, self);
  iter.for_each(
      [](char** data, const int64_t* strides, int64_t n) {
        auto* to = reinterpret_cast<float*>(data[0]);
        const auto* from = reinterpret_cast<const float*>(data[1]);
        if (strides[0] == sizeof(float) && strides[1] == sizeof(float)) return math::tanh_float(to, from, n);
        float buffer[64];  // strided: a gathered block at a time, the same arithmetic per element
        for (int64_t i = 0; i < n; i += 64) {
          const int64_t m = std::min<int64_t>(64, n - i);
          for (int64_t k = 0; k < m; ++k) buffer[k] = *reinterpret_cast<const float*>(data[1] + (i + k) * strides[1]);
          math::tanh_float(buffer, buffer, m);
          for (int64_t k = 0; k < m; ++k) *reinterpret_cast<float*>(data[0] + (i + k) * strides[0]) = buffer[k];
        }
      },
      /*grain_size=*/2048);  // ATen's, for its vector-math kernels
  torch::jit::drop(*stack, args);
  stack->emplace_back(iter.output());
  return true;
}

}  // namespace

void call_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // Every task passes here: compare schemas by address, found once.
  static const auto schema = [](const char* name, const char* overload) {
    return &c10::Dispatcher::singleton().findSchemaOrThrow(name, overload).schema();
  };
  static const c10::FunctionSchema *tanh = schema("aten::tanh", ""), *tanh_out = schema("aten::tanh", "out"),
                                   *tanh_ = schema("aten::tanh_", "");
  const c10::FunctionSchema* s = &op.schema();
  if ((s == tanh || s == tanh_out || s == tanh_) &&
      tanh_kernel(s == tanh_out ? Form::Out : s == tanh_ ? Form::InPlace : Form::Functional, stack))
    return;
  op.callBoxed(stack);
}

}  // namespace torchneuron::ops
