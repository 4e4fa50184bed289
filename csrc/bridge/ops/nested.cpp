// Nested tensors of the strided layout (torch.nested.nested_tensor's
// default) on `neuron`. Their CPU kernels work on the dense buffer through
// ATen operators, so they run unchanged on a neuron buffer, each buffer
// operation on the device: the NestedTensorPrivateUse1 key redispatches to
// the NestedTensorCPU kernels, as the key's catch-all kernel (m.fallback) and,
// for operators with a composite that would otherwise take the key, as their kernel.
#include <ATen/NestedTensorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/nested/NestedTensorUtils.h>
#include <ATen/ops/_nested_from_padded_native.h>
#include <ATen/ops/_nested_tensor_from_mask_native.h>
#include <torch/library.h>

#include <memory>

#include "../device_state.h"
#include "../exec/host_views.h"
#include "../sanitizers/memcheck.h"
#include "explicit_ops.h"

namespace torchneuron::ops {
namespace {

void run_nested_cpu_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  TORCH_CHECK_NOT_IMPLEMENTED(op.hasKernelForDispatchKey(c10::DispatchKey::NestedTensorCPU), "neuron: ",
                              op.schema().operator_name(), " has no kernel for nested tensors of the strided ",
                              "layout, on the CPU either; torch.nested's jagged layout (layout=torch.jagged) may run it");
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::NestedTensorCPU), stack);
}

// A nested tensor over `buffer` (a dense tensor over a whole storage) with
// the layout of `like`.
at::Tensor nested_over(at::Tensor buffer, const at::Tensor& like) {
  const auto* nt = at::native::get_nested_tensor_impl(like);
  return at::native::wrap_buffer(std::move(buffer), nt->get_nested_sizes().clone(),
                                 nt->get_nested_strides().clone(), nt->get_storage_offsets().clone());
}

// The fast paths of nn.MultiheadAttention and nn.TransformerEncoderLayer on
// nested tensors (an encoder's input with a padding mask, in eval): their
// NestedTensorCPU kernels call per-device dispatch stubs on their tensors'
// device, which have no entry for neuron. They run synchronously on host
// views instead, as the CPU runs them, and their results are copied to the
// device.
void run_nested_cpu_kernel_on_host(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  std::optional<c10::Device> device;
  for (auto it = stack->end() - n; it != stack->end(); ++it)
    for_each_tensor(*it, [&](const at::Tensor& t) {
      if (t.defined() && t.device().type() == kNeuron) device = t.device();
    });
  TORCH_INTERNAL_ASSERT(device, "a nested neuron tensor's operator without neuron tensors");
  translate_errors([&] { current_runtime_stream(device->index()).synchronize(); });
  memcheck::HostAccess access;
  SharedHostStorages shared;
  for (auto it = stack->end() - n; it != stack->end(); ++it)
    *it = map_tensors(*it, [](const at::Tensor& t) {
      if (!t.defined() || t.device().type() != kNeuron) return t;
      if (!t.is_nested()) return host_view(t);
      return nested_over(host_view(at::native::get_nested_tensor_impl(t)->get_unsafe_storage_as_tensor()), t);
    });
  {
    auto guard = below_autograd();
    op.callBoxed(stack);
  }
  const size_t r = op.schema().returns().size();
  for (auto it = stack->end() - r; it != stack->end(); ++it)
    *it = map_tensors(*it, [&](const at::Tensor& t) {
      if (!t.defined()) return t;
      if (!t.is_nested()) return t.to(*device);
      return nested_over(at::native::get_nested_tensor_impl(t)->get_unsafe_storage_as_tensor().to(*device), t);
    });
}

} // namespace

TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  for (const char* name : {"_native_multi_head_attention", "_transformer_encoder_layer_fwd"})
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&run_nested_cpu_kernel_on_host>());
}

// The dense-to-nested conversions: from a padded tensor (to_padded_tensor's
// backward), ATen's generic kernel, which CUDA has beside its own; from a
// padding mask (the Transformer encoder's fast path), the kernel of CPU and
// CUDA. Both are made of ATen operators.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_nested_from_padded", at::native::nested_from_padded_generic);
  m.impl("_nested_tensor_from_mask", at::native::NestedTensor_nested_tensor_from_mask);
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&run_nested_cpu_kernel>());
}

void prefer_nested_cpu_kernels() {
  static std::unique_ptr<torch::Library> lib = [] {
    auto& dispatcher = c10::Dispatcher::singleton();
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                                c10::DispatchKey::NestedTensorPrivateUse1, __FILE__, __LINE__);
    for (const auto& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      auto op = dispatcher.findOp(name);
      if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::NestedTensorCPU) ||
          op->hasKernelForDispatchKey(c10::DispatchKey::NestedTensorPrivateUse1))
        continue;
      std::string qualified = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
      lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&run_nested_cpu_kernel>());
    }
    return lib;
  }();
}

} // namespace torchneuron::ops
