#include "device_ops.h"

#include <ATen/TensorIterator.h>

#include <algorithm>

#include "tanh.h"

namespace torchneuron::device_ops {
namespace {

enum class Form : uint8_t { Functional, InPlace, Out };

// tanh of float32: the device's tanh over a TensorIterator built as ATen's
// structured kernel builds its own (output allocation and resizing, overlap
// checks), cut into thread ranges as ATen's is. False: ATen's kernel runs.
bool tanh_kernel(Form form, torch::jit::Stack* stack) {
  const size_t args = form == Form::Out ? 2 : 1;
  const at::Tensor& self = (*stack)[stack->size() - args].toTensor();
  at::Tensor out = form == Form::Out ? stack->back().toTensor() : form == Form::InPlace ? self : at::Tensor();
  if (self.scalar_type() != at::kFloat || (out.defined() && out.scalar_type() != at::kFloat))
    return false;
  at::TensorIterator iter = at::TensorIterator::unary_float_op(out, self);
  iter.for_each(
      [](char** data, const int64_t* strides, int64_t n) {
        auto* to = reinterpret_cast<float*>(data[0]);
        const auto* from = reinterpret_cast<const float*>(data[1]);
        if (strides[0] == sizeof(float) && strides[1] == sizeof(float)) return kernels::tanh_float(to, from, n);
        float buffer[64];  // strided: a gathered block at a time, the same arithmetic per element
        for (int64_t i = 0; i < n; i += 64) {
          const int64_t m = std::min<int64_t>(64, n - i);
          for (int64_t k = 0; k < m; ++k) buffer[k] = *reinterpret_cast<const float*>(data[1] + (i + k) * strides[1]);
          kernels::tanh_float(buffer, buffer, m);
          for (int64_t k = 0; k < m; ++k) *reinterpret_cast<float*>(data[0] + (i + k) * strides[0]) = buffer[k];
        }
      },
      /*grain_size=*/2048);  // ATen's, for its vector-math kernels
  torch::jit::drop(*stack, args);
  stack->emplace_back(iter.output());
  return true;
}

}  // namespace

bool tanh(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const Form form = schema.overload_name() == "out" ? Form::Out : schema.name().back() == '_' ? Form::InPlace : Form::Functional;
  return tanh_kernel(form, stack);
}

}  // namespace torchneuron::device_ops
