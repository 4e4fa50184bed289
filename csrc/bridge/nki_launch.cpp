// Launching NKI kernels (torchneuron/nki/torch_bridge.py) as device tasks.
//
//   torchneuron_nki::launch(int call, str name, Tensor(a!)[] outs, Tensor(b!)[] ins) -> ()
//       on neuron tensors: queues ONE task named "nki::<name>" on the current
//       stream of their device and returns. The task calls
//   torchneuron_nki::run(int call, Tensor(a!)[] outs, Tensor(b!)[] ins) -> ()
//       on CPU aliases of the same device memory. Its CPU kernel is
//       registered from Python (torch_bridge.py); the dispatcher takes the GIL
//       on the executor thread and runs the emulator on NumPy views of the
//       aliases. An exception it raises is kept by the device and raised at
//       the next synchronising call, naming the task.
//
// Registered statically (loading torchneuron._C is enough): no pybind
// binding is needed. The task holds the device tensors, so their memory
// outlives it whatever the host does meanwhile.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "device_state.h"
#include "op_tracking.h"
#include "ops/aliases.h"

namespace torchneuron {
namespace {

void launch(int64_t call, c10::string_view name, at::TensorList outs, at::TensorList ins) {
  c10::DeviceIndex device = -1;
  for (auto list : {outs, ins})
    for (const at::Tensor& t : list) {
      TORCH_CHECK(t.device().type() == kNeuron, "NKI kernel ", name, ": expected neuron tensors, got ", t.device());
      if (device < 0) device = t.device().index();
      TORCH_CHECK(t.device().index() == device, "NKI kernel ", name,
                  ": expected all tensors on one neuron device, got neuron:", int(device), " and ", t.device());
    }
  if (device < 0) device = current_device();
  c10::DeviceGuard guard(c10::Device(kNeuron, device));

  std::vector<at::Tensor> keep, host_outs, host_ins;
  for (const at::Tensor& t : outs) keep.push_back(t), host_outs.push_back(host_alias(t));
  for (const at::Tensor& t : ins) keep.push_back(t), host_ins.push_back(host_alias(t));
  std::string task = "nki::" + std::string(name);
  record_execution(c10::OperatorName(task, ""), Execution::Queued);
  translate_errors([&] {
    current_runtime_stream(device).enqueue(
        std::move(task), [call, keep = std::move(keep), host_outs = std::move(host_outs),
                          host_ins = std::move(host_ins)]() {
          static const auto run = c10::Dispatcher::singleton()
                                      .findSchemaOrThrow("torchneuron_nki::run", "")
                                      .typed<void(int64_t, at::TensorList, at::TensorList)>();
          auto below = below_autograd();
          run.call(call, host_outs, host_ins);
        });
  });
}

} // namespace

TORCH_LIBRARY(torchneuron_nki, m) {
  m.def("launch(int call, str name, Tensor(a!)[] outs, Tensor(b!)[] ins) -> ()");
  m.def("run(int call, Tensor(a!)[] outs, Tensor(b!)[] ins) -> ()");
}

TORCH_LIBRARY_IMPL(torchneuron_nki, PrivateUse1, m) {
  m.impl("launch", &launch);
}

} // namespace torchneuron
