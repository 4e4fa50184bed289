// The device random number generator: counter-based, like CUDA's Philox.
//
// Its state is (seed, offset). Each random operator claims the next offset on
// the host, when it is queued, and its task draws from an engine keyed by
// (seed, offset). So results depend only on the seed and the order of random
// operators, never on when the device runs them; get_rng_state() is exact
// while work is still queued; and the CPU generator is never touched.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <mutex>

namespace torchneuron {

struct NeuronGeneratorImpl final : c10::GeneratorImpl {
  explicit NeuronGeneratorImpl(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val);

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;  // a fresh non-deterministic seed
  void set_state(const c10::TensorImpl& state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type();

  // Claims the next draw: a CPU generator seeded from (seed, offset), for the
  // CPU kernel that a task runs on device memory.
  at::Generator claim_engine();

 private:
  NeuronGeneratorImpl* clone_impl() const override;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

const at::Generator& default_generator(c10::DeviceIndex device);
// The engine for one random operator: from `gen` if the user passed a neuron
// generator, else from the device's default generator.
at::Generator claim_engine(const std::optional<at::Generator>& gen, c10::DeviceIndex device);

} // namespace torchneuron
