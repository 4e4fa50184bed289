#include "device_state.h"

#include <array>
#include <string>

#include <c10/util/Exception.h>

namespace torchneuron {

namespace {
thread_local c10::DeviceIndex t_current_device = 0;
// Stream id per device for this thread; 0 is the default stream.
thread_local std::array<c10::StreamId, 64> t_current_stream{};
} // namespace

void rethrow_runtime_error(const std::exception& e) {
  if (auto* oom = dynamic_cast<const rt::OutOfMemoryError*>(&e))
    TORCH_CHECK_WITH(OutOfMemoryError, false, oom->what());
  if (dynamic_cast<const rt::UsageError*>(&e) && std::string(e.what()).find("invalid neuron device index") != std::string::npos)
    TORCH_CHECK_INDEX(false, e.what());
  std::string what = e.what();
  // A c10 error thrown by a task carries the C++ backtrace of the executor
  // thread, which says nothing about the user's code; as for errors raised
  // on the host, Python shows the message without it.
  if (dynamic_cast<const rt::AsyncError*>(&e)) what = what.substr(0, what.find("\nException raised from "));
  TORCH_CHECK(false, what);
}

void ensure_initialized() {
  translate_errors([] { rt::init(); });
}

c10::DeviceIndex device_count() noexcept { return static_cast<c10::DeviceIndex>(rt::device_count()); }

void check_device_index(c10::DeviceIndex index) {
  ensure_initialized();
  TORCH_CHECK_INDEX(index >= 0 && index < device_count(), "invalid neuron device index ", int(index),
                    ": ", int(device_count()), " device(s) are visible (NEURON_RT_VISIBLE_CORES)");
}

c10::DeviceIndex current_device() { return t_current_device; }

void set_current_device(c10::DeviceIndex index) {
  check_device_index(index);
  t_current_device = index;
}

c10::Stream current_stream(c10::DeviceIndex index) {
  if (index < 0) index = t_current_device;
  check_device_index(index);
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, index), t_current_stream[index]);
}

c10::Stream default_stream(c10::DeviceIndex index) {
  if (index < 0) index = t_current_device;
  check_device_index(index);
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, index), 0);
}

void set_current_stream(c10::Stream stream) {
  check_device_index(stream.device_index());
  t_current_stream[stream.device_index()] = stream.id();
}

rt::Stream& runtime_stream(c10::Stream stream) {
  return translate_errors([&]() -> rt::Stream& {
    return rt::device(stream.device_index()).stream(static_cast<int>(stream.id()));
  });
}

} // namespace torchneuron
