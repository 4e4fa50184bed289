// Generated C++ kernels (torch.compile) as device tasks without Python: see
// python_tasks.cpp. Bound in python_module.cpp for torchneuron/compile/launch.py.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

namespace torchneuron {

// The arguments of an Inductor kernel `extern "C" void kernel(...)` split by
// the register class the C calling convention gives them: `ints` are its
// pointers and int64_t arguments in order, `floats` its `float` arguments in
// order. Where they interleave does not matter (python_tasks.cpp says why).
constexpr size_t kMaxKernelInts = 1024;
constexpr size_t kMaxKernelFloats = 8;
struct KernelArgs {
  std::vector<int64_t> ints;
  std::vector<float> floats;
};

// The value of a 0-dim CPU tensor that a kernel reads through a pointer (a
// host scalar, e.g. a Python float Dynamo passes as a tensor), copied when
// the kernel is queued: the task then needs no reference to the tensor (whose
// release on the executor thread could take the GIL), and the kernel sees
// the value the scalar had at the call, as in program order.
struct HostScalar {
  alignas(16) std::array<unsigned char, 16> bytes{};
  explicit HostScalar(const at::Tensor& t);
  int64_t address() const { return reinterpret_cast<int64_t>(bytes.data()); }
};

// Calls `void kernel(...)` at address `fn` on this thread. Exceptions the
// kernel throws propagate.
void call_cpp_kernel(int64_t fn, const std::vector<int64_t>& ints, const std::vector<float>& floats);

// Queues that call as one task named `name` on the current stream of neuron
// device `device` (-1: the current device) and returns. `scalars`: (index in
// `args.ints`, 0-dim CPU tensor) passed as a pointer to a copy of its value.
void launch_cpp_kernel(int64_t fn, const std::string& name, c10::DeviceIndex device, KernelArgs args,
                       const std::vector<std::pair<int64_t, at::Tensor>>& scalars);

} // namespace torchneuron
