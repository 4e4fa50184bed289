#include "generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/Functions.h>
#include <c10/util/Exception.h>

#include <array>
#include <cstring>
#include <random>

#include "device_state.h"

namespace torchneuron {
namespace {

// splitmix64: turns (seed, offset) into well-separated engine seeds.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

constexpr size_t kStateBytes = 16;  // seed, offset

} // namespace

NeuronGeneratorImpl::NeuronGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(kNeuron, device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(seed) {}

void NeuronGeneratorImpl::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}
void NeuronGeneratorImpl::set_offset(uint64_t offset) { offset_ = offset; }
uint64_t NeuronGeneratorImpl::get_offset() const { return offset_; }
uint64_t NeuronGeneratorImpl::current_seed() const { return seed_; }

uint64_t NeuronGeneratorImpl::seed() {
  std::random_device rd;
  uint64_t s = (uint64_t(rd()) << 32) | rd();
  set_current_seed(s);
  return s;
}

void NeuronGeneratorImpl::set_state(const c10::TensorImpl& state) {
  TORCH_CHECK(state.dtype() == at::kByte && state.device().is_cpu(),
              "neuron RNG state must be a CPU torch.ByteTensor");
  TORCH_CHECK(static_cast<size_t>(state.numel()) == kStateBytes, "neuron RNG state must have ", kStateBytes,
              " bytes, got ", state.numel());
  uint64_t words[2];
  std::memcpy(words, state.data(), kStateBytes);
  seed_ = words[0];
  offset_ = words[1];
}

c10::intrusive_ptr<c10::TensorImpl> NeuronGeneratorImpl::get_state() const {
  auto state = at::empty({static_cast<int64_t>(kStateBytes)}, at::TensorOptions().dtype(at::kByte));
  uint64_t words[2] = {seed_, offset_};
  std::memcpy(state.data_ptr(), words, kStateBytes);
  return state.getIntrusivePtr();
}

c10::DeviceType NeuronGeneratorImpl::device_type() { return kNeuron; }

at::Generator NeuronGeneratorImpl::claim_engine() {
  uint64_t key;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    key = mix(seed_ ^ mix(offset_++));
  }
  return at::make_generator<at::CPUGeneratorImpl>(key);
}

NeuronGeneratorImpl* NeuronGeneratorImpl::clone_impl() const {
  auto* g = new NeuronGeneratorImpl(device().index(), seed_);
  g->offset_ = offset_;
  return g;
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  static std::array<at::Generator, rt::kMaxDevices> generators;
  static std::once_flag once;
  std::call_once(once, [] {
    for (c10::DeviceIndex i = 0; i < device_count(); ++i)
      generators[i] = at::make_generator<NeuronGeneratorImpl>(i);
  });
  if (device < 0) device = current_device();
  check_device_index(device);
  return generators[device];
}

at::Generator claim_engine(const std::optional<at::Generator>& gen, c10::DeviceIndex device) {
  const at::Generator& g = gen && gen->defined() ? *gen : default_generator(device);
  // PyTorch's wording for a generator of another device (check_generator)
  TORCH_CHECK(g.device().type() == kNeuron, "Expected a 'neuron' device type for generator but found '",
              g.device().type(), "'");
  return g.get<NeuronGeneratorImpl>()->claim_engine();
}

} // namespace torchneuron
