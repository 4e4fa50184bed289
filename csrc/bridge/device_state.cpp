#include "device_state.h"

#include <array>
#include <string>

#include <c10/util/Exception.h>

namespace torchneuron {

namespace {
thread_local c10::DeviceIndex t_current_device = 0;
// Stream id per device for this thread; 0 is the default stream.
thread_local std::array<c10::StreamId, rt::kMaxDevices> t_current_stream{};
} // namespace

namespace {
// A device task's error, raised as the exception type its kernel threw (an
// IndexError stays an IndexError), with the executor thread's C++ backtrace
// cut: it says nothing about the user's code.
[[noreturn]] void rethrow_async_error(const rt::AsyncError& e) {
  std::string what = e.what();
  what = what.substr(0, what.find("\nException raised from "));
  what += "\nThe device keeps its errors: every synchronising call on neuron:" + std::to_string(e.device) +
          " raises this one until torch.neuron.reset_errors() clears them.";
  try {
    if (e.cause) std::rethrow_exception(e.cause);
  } catch (const c10::IndexError&) {
    TORCH_CHECK_INDEX(false, what);
  } catch (const c10::ValueError&) {
    TORCH_CHECK_VALUE(false, what);
  } catch (const c10::TypeError&) {
    TORCH_CHECK_TYPE(false, what);
  } catch (const c10::NotImplementedError&) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, what);
  } catch (const c10::LinAlgError&) {
    TORCH_CHECK_WITH(LinAlgError, false, what);
  } catch (const c10::OutOfMemoryError&) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, what);
  } catch (const c10::DistBackendError&) {  // a collective of torch.distributed's neuron backend
    TORCH_CHECK_WITH(DistBackendError, false, what);
  } catch (...) {
  }
  TORCH_CHECK(false, what);
}
} // namespace

void rethrow_runtime_error(const std::exception& e) {
  if (auto* oom = dynamic_cast<const rt::OutOfMemoryError*>(&e))
    TORCH_CHECK_WITH(OutOfMemoryError, false, oom->what());
  if (auto* async = dynamic_cast<const rt::AsyncError*>(&e)) rethrow_async_error(*async);
  if (dynamic_cast<const rt::UsageError*>(&e) && std::string(e.what()).find("invalid neuron device index") != std::string::npos)
    TORCH_CHECK_INDEX(false, e.what());
  TORCH_CHECK(false, e.what());
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
