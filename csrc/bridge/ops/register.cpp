// Registration glue for `neuron` operators: explicit kernels (explicit_ops.h) and
// the executor (../exec/executor.h), the key's catch-all kernel (registered
// with PyTorch's m.fallback, which is not the synchronous fallback), which runs
// every other ATen operator on the device.
#include <torch/library.h>

#include "../exec/executor.h"
#include "../sanitizers/memcheck.h"
#include "explicit_ops.h"

namespace torchneuron::ops {
namespace {
// A kernel that may touch device memory on the calling thread, inside the
// memory checker's access scope (memcheck.h; nothing while it is off).
template <auto F>
struct HostAccessing;
template <class R, class... A, R (*F)(A...)>
struct HostAccessing<F> {
  static R call(A... a) {
    memcheck::HostAccess access;
    return F(std::forward<A>(a)...);
  }
};
template <auto F>
constexpr auto accessing() {
  return &HostAccessing<F>::call;
}
} // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", accessing<empty_memory_format>());
  m.impl("empty_strided", accessing<empty_strided>());
  m.impl("view", accessing<view>());
  m.impl("as_strided", accessing<as_strided>());
  m.impl("_reshape_alias", accessing<reshape_alias>());
  m.impl("resize_", accessing<resize_>());
  m.impl("set_.source_Storage_storage_offset", accessing<set_storage>());
  m.impl("set_.source_Storage", accessing<set_storage_whole>());
  m.impl("set_.source_Tensor", accessing<set_tensor>());
  m.impl("set_", accessing<set_empty>());
  m.impl("record_stream", accessing<record_stream>());
  m.impl("_has_compatible_shallow_copy_type", accessing<has_compatible_shallow_copy_type>());
  m.impl("_copy_from", accessing<copy_from>());
  m.impl("_copy_from_and_resize", accessing<copy_from_and_resize>());
  m.impl("_local_scalar_dense", accessing<local_scalar_dense>());
  m.impl("native_dropout", accessing<native_dropout>());
  m.impl("random_.from", torch::CppFunction::makeFromBoxedFunction<&random_range_checked>());
  m.impl("random_.to", torch::CppFunction::makeFromBoxedFunction<&random_range_checked>());
  m.impl("index_fill_.int_Tensor", torch::CppFunction::makeFromBoxedFunction<&index_fill_tensor_value>());
  m.impl("_foreach_addcdiv_.Tensor", accessing<foreach_addcdiv_tensor_>());
  m.impl("_foreach_addcmul_.Tensor", accessing<foreach_addcmul_tensor_>());
  m.impl("add.Tensor", accessing<add_tensor>());
  m.impl("sub.Tensor", accessing<sub_tensor>());
  m.impl("mul.Tensor", accessing<mul_tensor>());
  m.impl("div.Tensor", accessing<div_tensor>());
  m.impl("relu", accessing<relu>());
  m.impl("sum", accessing<sum>());
  m.impl("cat", accessing<cat>());
  m.impl("index.Tensor", accessing<index_tensor>());
  m.impl("mm", accessing<mm>());
  m.impl("addmm", accessing<addmm>());
}

// Recurrent layers: for the autograd key, which a composite would take, and
// for the backend key, which inference mode reaches directly.
void register_recurrent(torch::Library& m) {
  m.impl("lstm.input", accessing<lstm_padded>());
  m.impl("lstm.data", accessing<lstm_packed>());
  m.impl("gru.input", accessing<gru_padded>());
  m.impl("gru.data", accessing<gru_packed>());
  m.impl("rnn_tanh.input", accessing<rnn_tanh_padded>());
  m.impl("rnn_tanh.data", accessing<rnn_tanh_packed>());
  m.impl("rnn_relu.input", accessing<rnn_relu_padded>());
  m.impl("rnn_relu.data", accessing<rnn_relu_packed>());
  m.impl("lstm_cell", accessing<lstm_cell>());
  m.impl("gru_cell", accessing<gru_cell>());
}
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { register_recurrent(m); }
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { register_recurrent(m); }

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&execute_unless_only_the_generator_is_on_the_device>());
}
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_sparse>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_sparse>());
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
