// index_fill_.int_Tensor with its value a zero-dimensional CPU tensor. The
// value is host data: the CPU's and CUDA's kernels read it at the call
// (value.item()) and continue as index_fill_.int_Scalar. So does neuron: the
// Scalar overload then reaches the executor like any other call and queues,
// its value fixed when the call returns. Routed to the executor as it is, the
// call's meta pass would run PyTorch's Python meta function (torch._refs'
// index_fill_, through index_copy_), which refuses a value on another device
// than self's: the call would wait for the device and run synchronously.
// A value on the device keeps the executor's path (queued, read by the task).
// The kernels' first check, a value of more dimensions, is made here for
// either, with their message, ahead of the executor's check of devices.
#include <ATen/ATen.h>
#include <ATen/Operators.h>

#include "../exec/executor.h"
#include "explicit_ops.h"

namespace torchneuron::ops {

void index_fill_tensor_value(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // index_fill_.int_Tensor (self, dim, index, value)
  auto args = torch::jit::last(*stack, 4);
  const at::Tensor& value = args[3].toTensor();
  TORCH_CHECK(value.dim() == 0, "index_fill_ only supports a 0-dimensional value tensor, but got tensor with ",
              value.dim(), " dimension(s).");
  if (!value.is_cpu()) return execute(op, stack);
  at::Tensor self = args[0].toTensor();
  const int64_t dim = args[1].toInt();
  const at::Tensor index = args[2].toTensor();
  const at::Scalar fill = value.item();
  torch::jit::drop(*stack, 4);
  at::_ops::index_fill__int_Scalar::call(self, dim, index, fill);
  torch::jit::push(*stack, std::move(self));
}

} // namespace torchneuron::ops
