// Exact numerics for operators with both a CPU kernel and a generic composite.
//
// When a backend has no kernel of its own, the dispatcher gives it the
// CompositeExplicitAutograd implementation, which for a few operators (layer
// and group norm, addr, ...) is a different algorithm from the CPU kernel and
// rounds differently. Our device runs the CPU kernels, so for those operators
// we route `neuron` to the device executor, which runs the CPU kernel: results
// then match the CPU bit for bit. The list is computed from the dispatcher
// when the extension loads, so it follows PyTorch's registrations.
//
// Convolution is the other case: its composite picks an algorithm by device
// type and sends unknown devices to convolution_overrideable (unimplemented).
// Routing it to the executor makes the CPU's own algorithm choice apply.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <memory>
#include <vector>

#include "kernels.h"

namespace torchneuron::ops {
namespace {

struct PreferCpuKernels {
  std::vector<std::unique_ptr<torch::Library>> libraries;
  PreferCpuKernels() {
    auto& dispatcher = c10::Dispatcher::singleton();
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                                __FILE__, __LINE__);
    for (const char* op : {"convolution", "convolution_backward", "_convolution", "_convolution_double_backward"})
      lib->impl(op, torch::CppFunction::makeFromBoxedFunction<&device_fallback>());
    for (const auto& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      auto op = dispatcher.findOp(name);
      if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
          !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
          op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1))
        continue;
      std::string qualified = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
      lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&device_fallback>());
    }
    libraries.push_back(std::move(lib));
  }
};

PreferCpuKernels prefer_cpu_kernels;

} // namespace
} // namespace torchneuron::ops
