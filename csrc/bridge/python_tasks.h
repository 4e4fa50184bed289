// Generated C++ kernels (torch.compile) as device tasks without Python: see
// python_tasks.cpp. Bound in python_module.cpp for torchneuron/compile/launch.py.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/Device.h>

namespace torchneuron {

// Calls `void kernel(args...)` at address `fn` on this thread; every argument
// is a pointer or int64_t. Exceptions the kernel throws propagate.
void call_cpp_kernel(int64_t fn, const std::vector<int64_t>& args);

// Queues that call as one task named `name` on the current stream of neuron
// device `device` (-1: the current device) and returns.
void launch_cpp_kernel(int64_t fn, const std::string& name, c10::DeviceIndex device, std::vector<int64_t> args);

} // namespace torchneuron
