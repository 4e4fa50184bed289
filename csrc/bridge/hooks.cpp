// PrivateUse1 hooks: what ATen asks the backend directly (availability, lazy
// init, generators, pinned memory, which device owns a pointer).
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/core/GeneratorForPrivateuseone.h>

#include "allocator.h"
#include "device_state.h"
#include "generator.h"
#include "host_allocator.h"
#include "exec/storage_resize.h"

namespace torchneuron {
namespace {

struct NeuronHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  void init() const override { ensure_initialized(); }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_current_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_device();
    set_current_device(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override { return default_generator(d); }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override {
    if (d < 0) d = current_device();
    check_device_index(d);
    return at::make_generator<NeuronGeneratorImpl>(d);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    for (c10::DeviceIndex i = 0; i < device_count(); ++i)
      if (rt::device(i).contains(data)) return c10::Device(kNeuron, i);
    TORCH_CHECK(false, "pointer ", data, " is not in neuron device memory");
  }
  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &pinned_host_allocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    resize_storage_bytes(storage, nbytes);
  }
};

struct RegisterHooks {
  RegisterHooks() { at::RegisterPrivateUse1HooksInterface(new NeuronHooks()); }
} register_hooks;

} // namespace
} // namespace torchneuron
