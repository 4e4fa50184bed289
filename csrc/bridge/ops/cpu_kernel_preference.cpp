// Exact numerics for operators with both a CPU kernel and a generic composite.
//
// When a backend has no kernel of its own, the dispatcher gives it the
// CompositeExplicitAutograd implementation, which for a few operators (layer
// and group norm, addr, ...) is a different algorithm from the CPU kernel and
// rounds differently; likewise a CompositeImplicitAutograd one beside a CPU
// kernel (mish_backward, native_channel_shuffle). Our device runs the CPU kernels, so for those operators
// we route `neuron` to the device executor, which runs the CPU kernel: results
// then match the CPU bit for bit. The list is computed from the dispatcher
// when the extension loads, so it follows PyTorch's registrations.
//
// Structured operators (sum.dim_IntList, pow.Tensor_Tensor, ...) are routed
// too: their generic wrapper would compute the output on the host with the
// structured meta function and then call the out= overload through the
// dispatcher again; the executor's cached meta pass and direct out= call cost
// half as much. (Operators with kernels of their own, such as the lean ones
// in lean_path.cpp, are left as they are.)
//
// Convolution is the other case: its composite picks an algorithm by device
// type and sends unknown devices to convolution_overrideable (unimplemented).
// Routing it to the executor makes the CPU's own algorithm choice apply.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <memory>

#include "../exec/executor.h"
#include "../exec/op_policy.h"
#include "explicit_ops.h"

namespace torchneuron::ops {

void prefer_cpu_kernels() {
  static std::unique_ptr<torch::Library> lib = [] {
    auto& dispatcher = c10::Dispatcher::singleton();
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                                __FILE__, __LINE__);
    for (const char* op : ops_with_cpu_algorithm_choice())
      lib->impl(op, torch::CppFunction::makeFromBoxedFunction<&execute>());
    for (const auto& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      auto op = dispatcher.findOp(name);
      // In-place foreach operators have no CPU kernel: the CPU runs the
      // composite (one op per tensor), which here would queue one task per
      // tensor. (Functional ones return new tensors, which the executor
      // would compute on the host and copy: they keep the composite.)
      const bool foreach = name.name.rfind("aten::_foreach_", 0) == 0 && op && op->schema().returns().empty();
      if (!op || !(foreach || op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) ||
          op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
          !(op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
            op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
            op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)))
        continue;
      std::string qualified = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
      lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&execute>());
    }
    return lib;
  }();
}

} // namespace torchneuron::ops
