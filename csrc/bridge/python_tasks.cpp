// Python work as device tasks: how NKI kernels (torchneuron/nki/torch_bridge.py)
// and torch.compile'd kernels (torchneuron/compile/launch.py) run in stream
// order. Python side: torchneuron/_python_tasks.py.
//
//   torchneuron::launch_python_task(int call, str name, Tensor(a!)[] tensors)
//       on neuron tensors: queues ONE task named `name` on the current stream
//       of their device and returns. The task calls
//   torchneuron::run_python_task(int call, Tensor(a!)[] tensors)
//       with CPU aliases of the same device memory. Its CPU kernel is
//       registered from Python: the dispatcher takes the GIL on the executor
//       thread and runs the callable registered under `call`. An exception it
//       raises is kept by the device and raised at the next synchronising
//       call, naming the task.
//
// Like any queued operator, the task holds no references to the device
// tensors: memory freed on the host returns to its stream's pool and is
// reused only by later work of that stream (the caching allocator's stream
// order). Registered statically: loading torchneuron._C is enough.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "device_state.h"
#include "op_tracking.h"
#include "ops/aliases.h"

namespace torchneuron {
namespace {

void launch_python_task(int64_t call, c10::string_view name, at::TensorList tensors) {
  c10::DeviceIndex device = -1;
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.device().type() == kNeuron, name, ": expected neuron tensors, got ", t.device());
    if (device < 0) device = t.device().index();
    TORCH_CHECK(t.device().index() == device, name, ": expected all tensors on one neuron device, got neuron:",
                int(device), " and ", t.device());
  }
  if (device < 0) device = current_device();
  c10::DeviceGuard guard(c10::Device(kNeuron, device));

  std::vector<at::Tensor> host;
  host.reserve(tensors.size());
  for (const at::Tensor& t : tensors) host.push_back(host_alias(t));
  std::string task(name);
  record_execution(c10::OperatorName(task, ""), Execution::Queued);
  translate_errors([&] {
    current_runtime_stream(device).enqueue(std::move(task), [call, host = std::move(host)]() {
      static const auto run = c10::Dispatcher::singleton()
                                  .findSchemaOrThrow("torchneuron::run_python_task", "")
                                  .typed<void(int64_t, at::TensorList)>();
      auto below = below_autograd();
      run.call(call, host);
    });
  });
}

} // namespace

TORCH_LIBRARY(torchneuron, m) {
  m.def("launch_python_task(int call, str name, Tensor(a!)[] tensors) -> ()");
  m.def("run_python_task(int call, Tensor(a!)[] tensors) -> ()");
}

TORCH_LIBRARY_IMPL(torchneuron, PrivateUse1, m) {
  m.impl("launch_python_task", &launch_python_task);
}

} // namespace torchneuron
