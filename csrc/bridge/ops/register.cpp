// Registration glue for `neuron` operators: explicit kernels (kernels.h) and
// the boxed fallback that runs every other ATen operator on the device.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <memory>

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
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("native_dropout", native_dropout);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&device_fallback>());
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

namespace {

// Operators that would otherwise reach a CompositeExplicitAutograd kernel on
// `neuron` although the CPU has a kernel of its own. The composite kernel is a
// different algorithm (addr, native_layer_norm and native_group_norm decompose
// into bf16 steps; any/all.dims, _stack) or a generic backend switch that sends
// unknown backends to *_overrideable stubs (convolution). Sending them to the
// device executor runs the CPU kernel on device memory instead: bit-identical
// with the CPU and no missing-kernel errors.
const char* const kAlwaysDevice[] = {"convolution", "convolution_backward", "_convolution",
                                     "_convolution_double_backward"};

struct CompositeOverrides {
  std::unique_ptr<torch::Library> lib;
  CompositeOverrides() {
    lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__,
                                           __LINE__);
    auto& d = c10::Dispatcher::singleton();
    auto add = [&](const c10::OperatorName& name) {
      auto op = d.findOp(name);
      if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) return;
      std::string full = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
      lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&device_fallback>());
    };
    for (const c10::OperatorName& name : d.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      auto op = d.findOp(name);
      if (!op) continue;
      if (op->hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
          op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd))
        add(name);
    }
    for (const char* n : kAlwaysDevice)
      for (const char* overload : {""}) add(c10::OperatorName(std::string("aten::") + n, overload));
  }
};

const CompositeOverrides composite_overrides;

} // namespace

} // namespace torchneuron::ops
