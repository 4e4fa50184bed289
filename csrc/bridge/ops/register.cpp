// Registration glue for `neuron` operators: explicit kernels (kernels.h) and
// the executor (../exec/executor.h), PyTorch's boxed fallback for the key,
// which runs every other ATen operator on the device.
#include <torch/library.h>

#include "../exec/executor.h"
#include "kernels.h"

namespace torchneuron::ops {

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("view", view);
  m.impl("as_strided", as_strided);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", set_storage_whole);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_", set_empty);
  m.impl("record_stream", record_stream);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("native_dropout", native_dropout);
  m.impl("add.Tensor", add_tensor);
  m.impl("sub.Tensor", sub_tensor);
  m.impl("mul.Tensor", mul_tensor);
  m.impl("div.Tensor", div_tensor);
  m.impl("relu", relu);
  m.impl("sum", sum);
  m.impl("cat", cat);
  m.impl("index.Tensor", index_tensor);
  m.impl("mm", mm);
  m.impl("addmm", addmm);
}

// Recurrent layers: for the autograd key, which a composite would take, and
// for the backend key, which inference mode reaches directly.
void register_recurrent(torch::Library& m) {
  m.impl("lstm.input", lstm_padded);
  m.impl("lstm.data", lstm_packed);
  m.impl("gru.input", gru_padded);
  m.impl("gru.data", gru_packed);
  m.impl("rnn_tanh.input", rnn_tanh_padded);
  m.impl("rnn_tanh.data", rnn_tanh_packed);
  m.impl("rnn_relu.input", rnn_relu_padded);
  m.impl("rnn_relu.data", rnn_relu_packed);
  m.impl("lstm_cell", lstm_cell);
  m.impl("gru_cell", gru_cell);
}
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { register_recurrent(m); }
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { register_recurrent(m); }

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&execute>());
}

// Copies of conjugated or negated tensors: the CPU copy kernel (which the
// device copy runs on host aliases that keep the conj/neg bits) resolves them.
// Without this, the conjugate/negative fallback would materialise the source
// with clone(), whose copy_ reaches _copy_from again: endless recursion.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

} // namespace torchneuron::ops
