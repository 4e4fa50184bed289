// The autograd profiler's legacy device timing (`use_device="neuron"` with
// use_kineto=False): PyTorch records an event on the current stream as each
// operator begins and ends, and takes the device time between the two.
#include <torch/csrc/profiler/stubs/base.h>

#include <c10/util/ApproximateClock.h>

#include <memory>

#include "../device_state.h"

namespace torchneuron::profiler {
namespace {

struct LegacyStubs final : torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    const c10::DeviceIndex index = current_device();
    if (device) *device = index;
    auto marker = std::make_shared<rt::Event>(/*enable_timing=*/true);
    translate_errors([&] { marker->record(current_runtime_stream(index)); });
    *event = std::static_pointer_cast<void>(marker);
    if (cpu_ns) *cpu_ns = c10::getTime();
  }
  // Microseconds of device time between the two events.
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* first,
                const torch::profiler::impl::ProfilerVoidEventStub* second) const override {
    auto* a = static_cast<const rt::Event*>(first->get());
    auto* b = static_cast<const rt::Event*>(second->get());
    return translate_errors([&] {
      a->synchronize();
      b->synchronize();
      return static_cast<float>(a->elapsed_ms(*b) * 1e3);
    });
  }
  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    for (int i = 0; i < device_count(); ++i) op(i);
  }
  void synchronize() const override {
    for (int i = 0; i < device_count(); ++i) translate_errors([&] { rt::device(i).synchronize(); });
  }
};

struct Register {
  Register() {
    static LegacyStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
} registered;

} // namespace
} // namespace torchneuron::profiler
