// The explicit `neuron` kernels. Everything else reaches the executor
// (../exec/executor.h). Registration lives in register.cpp.
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <typeinfo>

namespace torchneuron::ops {

// storage.cpp: allocation, metadata, storage resizing
at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format);
at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory);
at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size);
at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset);
at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride);
const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format);
at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride);
at::Tensor& set_storage_whole(at::Tensor& self, c10::Storage source);
at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source);
at::Tensor& set_empty(at::Tensor& self);
void record_stream(at::Tensor& self, c10::Stream stream);
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from);

// copy.cpp: copies between host and device, reading values
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking);
at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst);
at::Scalar local_scalar_dense(const at::Tensor& self);

// random.cpp: random operators whose CPU kernels would use the CPU generator, and
// random_'s range checks
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train);
// random_.from and random_.to (boxed): the CPU kernel's range checks and
// warnings at every call, on the host, then the executor
void random_range_checked(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// The PrivateUse1 fallback: `execute`, but a call that reaches `neuron` only
// through its generator runs the CPU kernel, as with a CUDA generator.
void execute_unless_only_the_generator_is_on_the_device(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// non_strided.cpp: the boxed kernel of the sparse neuron keys, a clear refusal.
void refuse_sparse(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// index_fill_value.cpp: index_fill_.int_Tensor (boxed): a CPU zero-dimensional
// value is read at the call and passed on as index_fill_.int_Scalar
void index_fill_tensor_value(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// foreach_scalars.cpp: in-place foreach overloads taking a host tensor of
// scalars, read at the call and passed on as the Scalar[] overload
void foreach_addcdiv_tensor_(at::TensorList self, at::TensorList tensor1, at::TensorList tensor2,
                             const at::Tensor& scalars);
void foreach_addcmul_tensor_(at::TensorList self, at::TensorList tensor1, at::TensorList tensor2,
                             const at::Tensor& scalars);

// lean_path.cpp: the lean path for small operands of one dtype in plain
// layouts (contiguous; matrices also transposed); the rest of their calls go
// to the executor
at::Tensor add_tensor(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha);
at::Tensor sub_tensor(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha);
at::Tensor mul_tensor(const at::Tensor& self, const at::Tensor& other);
at::Tensor div_tensor(const at::Tensor& self, const at::Tensor& other);
at::Tensor relu(const at::Tensor& self);
at::Tensor sum(const at::Tensor& self, std::optional<at::ScalarType> dtype);
at::Tensor cat(const at::ITensorListRef& tensors, int64_t dim);
at::Tensor index_tensor(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices);
at::Tensor mm(const at::Tensor& self, const at::Tensor& mat2);
at::Tensor addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, const at::Scalar& beta,
                 const at::Scalar& alpha);

// recurrent.cpp: RNN, LSTM and GRU layers and cells, taking the CPU's branches
// of ATen's composites (registered for the autograd and the backend key)
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_padded(const at::Tensor& input, at::TensorList hx,
                                                           at::TensorList params, bool has_biases, int64_t num_layers,
                                                           double dropout, bool train, bool bidirectional,
                                                           bool batch_first);
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_packed(const at::Tensor& data, const at::Tensor& batch_sizes,
                                                           at::TensorList hx, at::TensorList params, bool has_biases,
                                                           int64_t num_layers, double dropout, bool train,
                                                           bool bidirectional);
#define TORCHNEURON_ONE_HIDDEN_RNN(name)                                                                            \
  std::tuple<at::Tensor, at::Tensor> name##_padded(const at::Tensor& input, const at::Tensor& hx,                   \
                                                   at::TensorList params, bool has_biases, int64_t num_layers,      \
                                                   double dropout, bool train, bool bidirectional, bool batch_first); \
  std::tuple<at::Tensor, at::Tensor> name##_packed(const at::Tensor& data, const at::Tensor& batch_sizes,           \
                                                   const at::Tensor& hx, at::TensorList params, bool has_biases,    \
                                                   int64_t num_layers, double dropout, bool train, bool bidirectional);
TORCHNEURON_ONE_HIDDEN_RNN(gru)
TORCHNEURON_ONE_HIDDEN_RNN(rnn_tanh)
TORCHNEURON_ONE_HIDDEN_RNN(rnn_relu)
#undef TORCHNEURON_ONE_HIDDEN_RNN
std::tuple<at::Tensor, at::Tensor> lstm_cell(const at::Tensor& input, at::TensorList hx, const at::Tensor& w_ih,
                                             const at::Tensor& w_hh, const std::optional<at::Tensor>& b_ih,
                                             const std::optional<at::Tensor>& b_hh);
at::Tensor gru_cell(const at::Tensor& input, const at::Tensor& hx, const at::Tensor& w_ih, const at::Tensor& w_hh,
                    const std::optional<at::Tensor>& b_ih, const std::optional<at::Tensor>& b_hh);

// group_norm_autograd.cpp: the C++ type of GroupNorm's backward node, which
// the Python layer shows as PyTorch's NativeGroupNormBackward0
const std::type_info& group_norm_backward_node_type();

// cpu_kernel_preference.cpp: routes operators whose generic composite would
// differ from the CPU kernel to the executor. Runs once the explicit
// kernels above are registered, which it leaves in place.
void prefer_cpu_kernels();
// The NestedTensorCPU kernels for nested neuron tensors (nested.cpp).
void prefer_nested_cpu_kernels();

} // namespace torchneuron::ops
