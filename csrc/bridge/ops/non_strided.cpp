// Operators reached with a sparse tensor on `neuron` (a CPU sparse tensor moved
// there, or one built with device="neuron"): neuron tensors are dense, so the
// call is refused naming the operator and the layout, where PyTorch would
// print its dispatcher's table of every backend the operator has.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include "explicit_ops.h"

namespace torchneuron::ops {

void refuse_sparse(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "neuron: ", op.schema().operator_name(),
                              " was called with a sparse tensor on neuron, and neuron tensors are dense (strided) "
                              "only; keep sparse tensors on the CPU, or make them dense first (.to_dense())");
}

} // namespace torchneuron::ops
