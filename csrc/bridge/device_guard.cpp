// The device guard: how PyTorch switches devices and streams and uses events
// for `neuron`. torch.Stream, torch.Event, torch.accelerator.* and the autograd
// engine all come through here.
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "allocator.h"
#include "device_state.h"
#include "sanitizers/stream_sanitizer.h"

namespace torchneuron {
namespace {

rt::Event* as_event(void* e) { return static_cast<rt::Event*>(e); }

struct NeuronGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNeuron; }

  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    if (d.index() != old.index()) set_current_device(d.index());
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kNeuron, current_device()); }
  void setDevice(c10::Device d) const override { set_current_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < device_count()) {
      try {
        set_current_device(d.index());
      } catch (...) {
      }
    }
  }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }

  // torch.accelerator.get_device_capability(): the dtypes the device computes.
  // Every dense one the CPU's kernels do; quantized tensors have no neuron
  // backend.
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    const c10::DeviceIndex index = d.index() < 0 ? current_device() : d.index();
    TORCH_CHECK(index >= 0 && index < device_count(), "Invalid device index ", int(index), " for ", int(device_count()),
                " neuron device(s)");
    c10::DeviceCapability capability;
    auto& types = capability.capability_data.supported_scalar_types;
    types.has_QInt8 = types.has_QUInt8 = types.has_QInt32 = types.has_QUInt4x2 = types.has_QUInt2x4 = false;
    return capability;
  }

  c10::Stream getStream(c10::Device d) const override { return current_stream(d.index()); }
  c10::Stream getDefaultStream(c10::Device d) const override { return default_stream(d.index()); }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    auto index = d.index() < 0 ? current_device() : d.index();
    check_device_index(index);
    int id = translate_errors([&] { return rt::device(index).next_pool_stream(); });
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, index), id);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    return getNewStream(d, 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto old = current_stream(s.device_index());
    set_current_stream(s);
    return old;
  }
  bool queryStream(const c10::Stream& s) const override { return runtime_stream(s).query(); }
  void synchronizeStream(const c10::Stream& s) const override {
    translate_errors([&] { runtime_stream(s).synchronize(); });
    sanitizer::log(sanitizer::Kind::StreamSynchronize, s.device_index(), int(s.id()));
  }
  void synchronizeDevice(c10::DeviceIndex index) const override {
    check_device_index(index);
    translate_errors([&] { rt::device(index).synchronize(); });
    sanitizer::log(sanitizer::Kind::DeviceSynchronize, index, 0);
  }

  void record(void** event, const c10::Stream& s, c10::DeviceIndex /*index*/,
              c10::EventFlag flag) const override {
    if (!*event) *event = new rt::Event(flag == c10::EventFlag::BACKEND_DEFAULT);
    translate_errors([&] { as_event(*event)->record(runtime_stream(s)); });
    sanitizer::log(sanitizer::Kind::EventRecord, s.device_index(), int(s.id()), *event);
  }
  void block(void* event, const c10::Stream& s) const override {
    if (event) translate_errors([&] { as_event(event)->block(runtime_stream(s)); });
    sanitizer::log(sanitizer::Kind::EventWait, s.device_index(), int(s.id()), event);
  }
  bool queryEvent(void* event) const override { return !event || as_event(event)->query(); }
  void synchronizeEvent(void* event) const override {
    if (event) translate_errors([&] { as_event(event)->synchronize(); });
    sanitizer::log(sanitizer::Kind::EventSynchronize, 0, 0, event);
  }
  double elapsedTime(void* start, void* end, c10::DeviceIndex) const override {
    TORCH_CHECK(start && end, "elapsed_time needs both events to be recorded first");
    return translate_errors([&] { return as_event(start)->elapsed_ms(*as_event(end)); });
  }
  void destroyEvent(void* event, c10::DeviceIndex) const noexcept override {
    sanitizer::log(sanitizer::Kind::EventDestroy, 0, 0, event);
    delete as_event(event);
  }
  void recordDataPtrOnStream(const c10::DataPtr& ptr, const c10::Stream& s) const override {
    device_allocator().recordStream(ptr, s);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

} // namespace
} // namespace torchneuron
