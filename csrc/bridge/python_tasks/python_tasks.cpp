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
//                       the given pointer/integer/float arguments and copies
//                       of its host scalars (no GIL taken);
//   call_cpp_kernel     calls it on this thread (compiled_replay.cpp).
#include "python_tasks.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "../device_state.h"
#include "../exec/host_views.h"
#include "../exec/thread_count.h"
#include "../sanitizers/memcheck.h"
#include "../sanitizers/op_tracking.h"

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
  for (const at::Tensor& t : tensors) host.push_back(host_view(t));
  std::string task(name);
  record_execution(c10::OperatorName(task, ""), Execution::Queued);
  translate_errors([&] {
    current_runtime_stream(device).enqueue(std::move(task), [call, host = std::move(host)]() {
      static const auto run = c10::Dispatcher::singleton()
                                  .findSchemaOrThrow("torchneuron::run_python_task", "")
                                  .typed<void(int64_t, at::TensorList)>();
      auto below = below_autograd();
      follow_host_thread_count();
      if (memcheck::on())
        for (const at::Tensor& h : host) memcheck::viewed(h.storage().data());
      run.call(call, host);
    });
  });
}

// Every argument of an Inductor C++ kernel is a pointer, an int64_t or a
// float (the binding's own argument parser accepts nothing else). The x86-64
// SysV and AArch64 calling conventions give pointers and integers the integer
// registers in order and floats the FP registers in order (8 of them on
// both), and pass the arguments that find no register on the stack in
// argument order, 8 bytes each. While every float fits in a register, only
// the order within each class matters: a kernel with N integer-class
// arguments and up to 8 floats, interleaved in any way, can be called through
// `void(*)(float x 8, int64_t x N)`. Arguments the callee does not take are
// ignored: FP registers, and (the caller owns the stack arguments in both
// conventions) trailing stack slots. So up to kExactArgs integer-class
// arguments a kernel gets exactly its count; longer ones (foreach kernels
// over many parameters) go through the next of a few longer signatures,
// padded with zeros.
constexpr size_t kExactArgs = 64;
constexpr std::array<size_t, 4> kPaddedArgs = {128, 256, 512, kMaxKernelInts};
using Caller = void (*)(void*, const int64_t*, const float*);

template <size_t... I>
void call_with(void* fn, const int64_t* a, const float* f, std::index_sequence<I...>) {
  using Fn = void (*)(float, float, float, float, float, float, float, float, decltype((void)I, int64_t{})...);
  reinterpret_cast<Fn>(fn)(f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], a[I]...);
}

template <size_t N>
void call_n(void* fn, const int64_t* a, const float* f) {
  call_with(fn, a, f, std::make_index_sequence<N>{});
}

template <size_t... N>
constexpr std::array<Caller, sizeof...(N)> caller_table(std::index_sequence<N...>) {
  return {&call_n<N>...};
}

constexpr auto kCallers = caller_table(std::make_index_sequence<kExactArgs + 1>{});
constexpr std::array<Caller, kPaddedArgs.size()> kPaddedCallers = {
    &call_n<kPaddedArgs[0]>, &call_n<kPaddedArgs[1]>, &call_n<kPaddedArgs[2]>, &call_n<kPaddedArgs[3]>};
static_assert(kMaxKernelFloats == 8, "call_with passes 8 float registers");

void check_kernel_args(const std::string& name, size_t ints, size_t floats) {
  TORCH_CHECK(ints <= kMaxKernelInts, name, ": ", ints, " pointer and integer arguments, at most ", kMaxKernelInts,
              " supported");
  TORCH_CHECK(floats <= kMaxKernelFloats, name, ": ", floats, " float arguments, at most ", kMaxKernelFloats,
              " supported");
}

} // namespace

HostScalar::HostScalar(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 0 && t.element_size() <= static_cast<int64_t>(bytes.size()),
              "compiled kernel: a host scalar must be a 0-dim CPU tensor of at most ", bytes.size(),
              " bytes, got ", t.device(), " ", t.sizes(), " ", t.scalar_type());
  std::memcpy(bytes.data(), t.const_data_ptr(), t.element_size());
}

void call_cpp_kernel(int64_t fn, const std::vector<int64_t>& ints, const std::vector<float>& floats) {
  TORCH_CHECK(fn != 0, "compiled kernel: null entry point");
  check_kernel_args("compiled kernel", ints.size(), floats.size());
  std::array<float, kMaxKernelFloats> f{};
  std::copy(floats.begin(), floats.end(), f.begin());
  if (ints.size() <= kExactArgs) {
    kCallers[ints.size()](reinterpret_cast<void*>(fn), ints.data(), f.data());
    return;
  }
  const size_t k = std::find_if(kPaddedArgs.begin(), kPaddedArgs.end(), [&](size_t n) { return n >= ints.size(); }) -
                   kPaddedArgs.begin();
  std::vector<int64_t> padded(kPaddedArgs[k], 0);
  std::copy(ints.begin(), ints.end(), padded.begin());
  kPaddedCallers[k](reinterpret_cast<void*>(fn), padded.data(), f.data());
}

void launch_cpp_kernel(int64_t fn, const std::string& name, c10::DeviceIndex device, KernelArgs args,
                       const std::vector<std::pair<int64_t, at::Tensor>>& scalars) {
  check_kernel_args(name, args.ints.size(), args.floats.size());
  std::vector<std::pair<int64_t, HostScalar>> values;
  for (const auto& [pos, t] : scalars) {
    TORCH_CHECK(pos >= 0 && pos < int64_t(args.ints.size()), name, ": host scalar argument ", pos, " out of range");
    values.emplace_back(pos, HostScalar(t));
  }
  if (device < 0) device = current_device();
  c10::DeviceGuard guard(c10::Device(kNeuron, device));
  record_execution(c10::OperatorName(name, ""), Execution::Queued);
  translate_errors([&] {
    current_runtime_stream(device).enqueue(name, [fn, args = std::move(args), values = std::move(values)]() mutable {
      // (the copies' addresses are final only now, inside the task)
      for (const auto& [pos, v] : values) args.ints[pos] = v.address();
      if (memcheck::on())  // pointer arguments: the checker ignores integers that point nowhere
        for (int64_t a : args.ints) memcheck::viewed(reinterpret_cast<const void*>(a));
      call_cpp_kernel(fn, args.ints, args.floats);
    });
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
