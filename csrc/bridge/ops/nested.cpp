// Nested tensors of the strided layout (torch.nested.nested_tensor's
// default) on `neuron`. Their CPU kernels work on the dense buffer through
// ATen operators, so they run unchanged on a neuron buffer, each buffer
// operation on the device: the NestedTensorPrivateUse1 key redispatches to
// the NestedTensorCPU kernels, as a fallback and, for operators with a
// composite that would otherwise take the key, as their kernel.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_nested_from_padded_native.h>
#include <torch/library.h>

#include <memory>

#include "kernels.h"

namespace torchneuron::ops {
namespace {

void run_nested_cpu_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  TORCH_CHECK_NOT_IMPLEMENTED(op.hasKernelForDispatchKey(c10::DispatchKey::NestedTensorCPU), "neuron: ",
                              op.schema().operator_name(), " has no kernel for nested tensors of the strided ",
                              "layout, on the CPU either; torch.nested's jagged layout (layout=torch.jagged) may run it");
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::NestedTensorCPU), stack);
}

} // namespace

// The dense-to-nested conversion (to_padded_tensor's backward): ATen's
// generic kernel, which CUDA has beside its own, is made of ATen operators.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("_nested_from_padded", at::native::nested_from_padded_generic); }

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
