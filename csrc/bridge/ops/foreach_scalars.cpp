// The foreach operators' overloads that take their scalars as a 1-D tensor
// (`_foreach_addcdiv_.Tensor`, `_foreach_addcmul_.Tensor`), in place. The
// tensor of scalars is host data: the CPU's and CUDA's kernels read it at the
// call (ATen's convert_tensor_to_scalar_list, which requires it on the CPU)
// and continue as the Scalar[] overload. So does neuron: the Scalar[]
// overload then reaches the executor like any other call, with the CPU's
// argument checks at the call (integer division, a complex scalar into a
// real tensor) and its values fixed when the call returns. Routed to the
// executor as a whole, the host tensor of scalars would be refused as a
// second device, ahead of the checks the CPU makes.
// (The functional overloads keep ATen's composite, which does the same.)
#include <ATen/ATen.h>
#include <ATen/native/ForeachUtils.h>

#include "explicit_ops.h"

namespace torchneuron::ops {

void foreach_addcdiv_tensor_(at::TensorList self, at::TensorList tensor1, at::TensorList tensor2,
                             const at::Tensor& scalars) {
  const auto values = at::native::convert_tensor_to_scalar_list(scalars, static_cast<int64_t>(self.size()));
  at::_foreach_addcdiv_(self, tensor1, tensor2, values);
}

void foreach_addcmul_tensor_(at::TensorList self, at::TensorList tensor1, at::TensorList tensor2,
                             const at::Tensor& scalars) {
  const auto values = at::native::convert_tensor_to_scalar_list(scalars, static_cast<int64_t>(self.size()));
  at::_foreach_addcmul_(self, tensor1, tensor2, values);
}

} // namespace torchneuron::ops
