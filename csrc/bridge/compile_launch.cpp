// Launching kernels of torch.compile'd graphs (torchneuron/compile/) as device tasks.
//
//   torchneuron_compile::launch(int call, str name, Tensor(a!)[] args) -> ()
//       on neuron tensors: queues ONE task named "compiled::<name>" on the
//       current stream of their device and returns. The task calls
//   torchneuron_compile::run(int call, Tensor(a!)[] args) -> ()
//       with CPU aliases of the same device memory. Its CPU kernel is
//       registered from Python (torchneuron/compile/launch.py): the dispatcher
//       takes the GIL on the executor thread and the Python side runs the
//       Inductor-generated C++ kernel registered under `call` (its arguments
//       are raw pointers into host-addressable device memory). An exception it
//       raises is kept by the device and raised at the next synchronising
//       call, naming the task.
//
// The task holds the device tensors, so their memory outlives it whatever the
// host (the generated wrapper, which frees buffers eagerly) does meanwhile.
// Registered statically: loading torchneuron._C is enough.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "device_state.h"
#include "op_tracking.h"
#include "ops/aliases.h"

namespace torchneuron {
namespace {

void launch(int64_t call, c10::string_view name, at::TensorList args) {
  c10::DeviceIndex device = -1;
  for (const at::Tensor& t : args) {
    TORCH_CHECK(t.device().type() == kNeuron, "compiled kernel ", name, ": expected neuron tensors, got ",
                t.device());
    if (device < 0) device = t.device().index();
    TORCH_CHECK(t.device().index() == device, "compiled kernel ", name,
                ": expected all tensors on one neuron device, got neuron:", int(device), " and ", t.device());
  }
  if (device < 0) device = current_device();
  c10::DeviceGuard guard(c10::Device(kNeuron, device));

  std::vector<at::Tensor> keep, host;
  keep.reserve(args.size());
  host.reserve(args.size());
  for (const at::Tensor& t : args) keep.push_back(t), host.push_back(host_alias(t));
  std::string task = "compiled::" + std::string(name);
  record_execution(c10::OperatorName(task, ""), Execution::Queued);
  translate_errors([&] {
    current_runtime_stream(device).enqueue(
        std::move(task), [call, keep = std::move(keep), host = std::move(host)]() {
          static const auto run = c10::Dispatcher::singleton()
                                      .findSchemaOrThrow("torchneuron_compile::run", "")
                                      .typed<void(int64_t, at::TensorList)>();
          auto below = below_autograd();
          run.call(call, host);
        });
  });
}

} // namespace

TORCH_LIBRARY(torchneuron_compile, m) {
  m.def("launch(int call, str name, Tensor(a!)[] args) -> ()");
  m.def("run(int call, Tensor(a!)[] args) -> ()");
}

TORCH_LIBRARY_IMPL(torchneuron_compile, PrivateUse1, m) {
  m.impl("launch", &launch);
}

} // namespace torchneuron
