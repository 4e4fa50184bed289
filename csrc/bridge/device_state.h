// What the bridge knows about "now": this thread's current device and, per
// device, its current stream (thread-local, as on CUDA), plus the translation
// of runtime errors into the PyTorch exceptions users expect.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include "runtime/runtime.h"

namespace torchneuron {

namespace rt = torchneuron::runtime;

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

// Initialises the runtime on first use; raises a clear error for an invalid
// configuration or a forked child.
void ensure_initialized();
c10::DeviceIndex device_count() noexcept;
void check_device_index(c10::DeviceIndex index);

c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);

c10::Stream current_stream(c10::DeviceIndex index);
c10::Stream default_stream(c10::DeviceIndex index);
void set_current_stream(c10::Stream stream);  // for the stream's device
rt::Stream& runtime_stream(c10::Stream stream);
inline rt::Stream& current_runtime_stream(c10::DeviceIndex index) {
  return runtime_stream(current_stream(index));
}

// Runs `fn`, turning runtime exceptions into c10 ones (OutOfMemoryError stays
// an out-of-memory error so Python sees torch.OutOfMemoryError).
[[noreturn]] void rethrow_runtime_error(const std::exception& e);
template <class F>
decltype(auto) translate_errors(F&& fn) {
  try {
    return fn();
  } catch (const rt::OutOfMemoryError& e) {
    rethrow_runtime_error(e);
  } catch (const rt::AsyncError& e) {
    rethrow_runtime_error(e);
  } catch (const rt::UsageError& e) {
    rethrow_runtime_error(e);
  } catch (const rt::ConfigError& e) {
    rethrow_runtime_error(e);
  }
}

} // namespace torchneuron
