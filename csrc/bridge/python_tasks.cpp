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
//
// Generated C++ kernels of torch.compile (Inductor's `extern "C" void
// kernel(T0 a0, ...)`) need no Python at all (python_tasks.h):
//   launch_cpp_kernel   queues ONE task calling the kernel's entry point with
//                       the given integer/pointer arguments (no GIL taken);
//   call_cpp_kernel     calls it on this thread (the caller releases the GIL).
#include "python_tasks.h"

#include <array>
#include <utility>

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

// Every argument of an Inductor C++ kernel we call this way is a pointer or
// an int64_t (the launcher checks; float arguments keep the Python binding).
// Both are passed in the same integer registers / 8-byte stack slots by the
// x86-64 SysV and AArch64 calling conventions, so a kernel taking N of them
// can be called through `void(*)(int64_t x N)`.
constexpr size_t kMaxKernelArgs = 64;
using Caller = void (*)(void*, const int64_t*);

template <size_t... I>
void call_with(void* fn, const int64_t* a, std::index_sequence<I...>) {
  using Fn = void (*)(decltype((void)I, int64_t{})...);
  reinterpret_cast<Fn>(fn)(a[I]...);
}

template <size_t N>
void call_n(void* fn, const int64_t* a) {
  call_with(fn, a, std::make_index_sequence<N>{});
}

template <size_t... N>
constexpr std::array<Caller, sizeof...(N)> caller_table(std::index_sequence<N...>) {
  return {&call_n<N>...};
}

constexpr auto kCallers = caller_table(std::make_index_sequence<kMaxKernelArgs + 1>{});

} // namespace

void call_cpp_kernel(int64_t fn, const std::vector<int64_t>& args) {
  TORCH_CHECK(fn != 0, "compiled kernel: null entry point");
  TORCH_CHECK(args.size() <= kMaxKernelArgs, "compiled kernel: ", args.size(), " arguments, at most ",
              kMaxKernelArgs, " supported");
  kCallers[args.size()](reinterpret_cast<void*>(fn), args.data());
}

void launch_cpp_kernel(int64_t fn, const std::string& name, c10::DeviceIndex device, std::vector<int64_t> args) {
  TORCH_CHECK(args.size() <= kMaxKernelArgs, name, ": ", args.size(), " arguments, at most ", kMaxKernelArgs,
              " supported");
  if (device < 0) device = current_device();
  c10::DeviceGuard guard(c10::Device(kNeuron, device));
  record_execution(c10::OperatorName(name, ""), Execution::Queued);
  translate_errors([&] {
    current_runtime_stream(device).enqueue(name, [fn, args = std::move(args)]() { call_cpp_kernel(fn, args); });
  });
}

TORCH_LIBRARY(torchneuron, m) {
  m.def("launch_python_task(int call, str name, Tensor(a!)[] tensors) -> ()");
  m.def("run_python_task(int call, Tensor(a!)[] tensors) -> ()");
}

TORCH_LIBRARY_IMPL(torchneuron, PrivateUse1, m) {
  m.impl("launch_python_task", &launch_python_task);
}

} // namespace torchneuron
