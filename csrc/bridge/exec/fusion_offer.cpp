#include "fusion_offer.h"

#include <ATen/Context.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

namespace torchneuron {
namespace {

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> flag{[] {
    const char* v = std::getenv("TORCHNEURON_ADAPTIVE_EAGER");
    return !(v && std::string(v) == "0");
  }()};
  return flag;
}

std::atomic<int64_t> min_numel{kFusionFloor};
std::atomic<Fuser> installed{nullptr};

} // namespace

int64_t min_fusable_numel() { return min_numel.load(std::memory_order_relaxed); }
void set_min_fusable_numel(int64_t numel) { min_numel.store(std::max<int64_t>(numel, kFusionFloor)); }

bool adaptive_eager_enabled() {
  return enabled_flag().load(std::memory_order_relaxed) && !at::globalContext().deterministicAlgorithms();
}
void set_adaptive_eager(bool enabled) { enabled_flag().store(enabled); }

bool offer_to_fuser(runtime::Stream& stream, ElementwiseCall& call) {
  const Fuser fuser = installed.load(std::memory_order_acquire);
  return fuser && fuser(stream, call);
}
void install_fuser(Fuser fuser) { installed.store(fuser, std::memory_order_release); }

} // namespace torchneuron
