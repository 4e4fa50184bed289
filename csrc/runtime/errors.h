// Errors the emulated device reports. The runtime has no PyTorch dependency, so
// these are plain C++ exceptions; the bridge translates them into the PyTorch
// exception a user expects (torch.OutOfMemoryError, RuntimeError, ...).
#pragma once

#include <cstddef>
#include <exception>
#include <stdexcept>
#include <string>

namespace torchneuron::runtime {

// A configuration variable (NEURON_RT_VISIBLE_CORES, TORCHNEURON_HBM_BYTES, ...)
// that cannot be parsed. Raised when the runtime initialises.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A request for device memory beyond the device's capacity.
struct OutOfMemoryError : std::runtime_error {
  OutOfMemoryError(int device, size_t requested, size_t in_use, size_t capacity);
  int device;
  size_t requested, in_use, capacity;
};

// An error thrown by a device task, naming the task (the operator) that
// failed. The device keeps it (Device::record_error) and raises it at
// synchronising calls; `cause` is the task's own exception, so that the
// bridge can raise the exception type the kernel threw.
struct AsyncError : std::runtime_error {
  AsyncError(int device, int stream, std::string task, std::string detail, std::exception_ptr cause = nullptr,
             size_t later_failures = 0);
  int device, stream;
  std::string task, detail;
  std::exception_ptr cause;
};

// Invalid use of the runtime API (device index out of range, ...).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

} // namespace torchneuron::runtime
