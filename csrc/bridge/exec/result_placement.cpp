#include "result_placement.h"

#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <mutex>

#include "../torch_patches.h"
#include "host_views.h"
#include "result_copy.h"

namespace torchneuron {
namespace {

// A result's device memory, offered to one of the kernel's requests of its
// exact size.
struct Target {
  void* data;
  size_t nbytes;
  size_t result;    // its index among the flattened outputs
  size_t request;   // which request of this size it answers
  size_t seen = 0;  // requests of this size so far
  bool taken = false;
};

struct Request {
  size_t nbytes;
  void* data;
};

// The placement of the task running on this thread.
struct Placement {
  std::vector<Target> targets;
  std::vector<Request> requests;  // of a target's size, in order, to learn from
  std::vector<void*> placed;      // blocks handed out
  bool active = false;
};
thread_local Placement tls;

constexpr size_t kRequestsKept = 64;

// Placed blocks not yet given back, from every thread: a kernel may drop an
// allocation on another thread, and the raw interface names only the address.
class Outstanding {
 public:
  void add(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    blocks_.push_back(p);
    count_.store(blocks_.size(), std::memory_order_release);
  }
  // False if `p` is not placed memory.
  bool remove(void* p) {
    if (count_.load(std::memory_order_acquire) == 0) return false;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(blocks_.begin(), blocks_.end(), p);
    if (it == blocks_.end()) return false;
    *it = blocks_.back();
    blocks_.pop_back();
    count_.store(blocks_.size(), std::memory_order_release);
    return true;
  }
  bool contains(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    return std::find(blocks_.begin(), blocks_.end(), p) != blocks_.end();
  }

 private:
  std::mutex mu_;
  std::vector<void*> blocks_;  // a few per running task
  std::atomic<size_t> count_{0};
};
Outstanding& outstanding() {
  static auto* o = new Outstanding();  // deleters may run during exit
  return *o;
}

std::atomic<int64_t> results_in_place{0}, results_copied{0};

c10::DeleterFnPtr base_raw_delete = nullptr;

// The memory itself is the device allocator's: giving it back only records it.
void release_placed(void* p) { outstanding().remove(p); }

void raw_delete(void* p) {
  if (!outstanding().remove(p)) base_raw_delete(p);
}

// Wraps the CPU allocator (torch_patches.h, at first use): the placing is a property of
// the running task (thread-local); every other allocation goes through.
struct PlacingAllocator final : c10::Allocator {
  c10::Allocator* base;
  explicit PlacingAllocator(c10::Allocator* b) : base(b) {}

  c10::DataPtr allocate(size_t n) override {
    if (!tls.active || n == 0) return base->allocate(n);
    Target* chosen = nullptr;
    bool sized = false;
    for (Target& t : tls.targets)
      if (t.nbytes == n) {
        sized = true;
        if (!chosen && !t.taken && t.seen == t.request) chosen = &t;
        ++t.seen;
      }
    if (!sized) return base->allocate(n);
    c10::DataPtr d;
    if (chosen) {
      chosen->taken = true;
      outstanding().add(chosen->data);
      tls.placed.push_back(chosen->data);
      // Data and context are the same address, as raw_allocate requires.
      d = c10::DataPtr(chosen->data, chosen->data, release_placed, c10::Device(c10::kCPU));
    } else {
      d = base->allocate(n);
    }
    if (tls.requests.size() < kRequestsKept) tls.requests.push_back({n, d.get()});
    return d;
  }
  c10::DeleterFnPtr raw_deleter() const override { return base_raw_delete ? raw_delete : nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { base->copy_data(dest, src, count); }
};

void install() {
  static PlacingAllocator* placing = [] {
    auto* p = new PlacingAllocator(c10::GetCPUAllocator());  // never destroyed: deleters may run during exit
    base_raw_delete = p->base->raw_deleter();
    return p;
  }();
  torch_patches::replace_cpu_allocator(placing);
}

bool same_view(const at::Tensor& a, const at::Tensor& b) {
  return a.data_ptr() == b.data_ptr() && a.sizes() == b.sizes() && a.strides() == b.strides() &&
         a.dtype() == b.dtype();
}

void collect(const c10::IValue& v, std::vector<at::Tensor>& out) {
  for_each_tensor(v, [&](const at::Tensor& t) { out.push_back(t); });
}

// Which request of its size returned `result`, if it came straight from the
// allocator during the call (the latest such request: freed addresses recur).
std::optional<size_t> request_of(const at::Tensor& result, size_t nbytes) {
  if (!result.defined() || !result.has_storage() || result.storage().nbytes() != nbytes) return std::nullopt;
  const void* p = result.storage().data();
  std::optional<size_t> found;
  size_t ordinal = 0;
  for (const Request& r : tls.requests)
    if (r.nbytes == nbytes) {
      if (r.data == p) found = ordinal;
      ++ordinal;
    }
  return found;
}

// What the requests of a kernel call depend on: its arguments' dtypes,
// sizes and strides, and its integer and boolean options.
uint64_t call_signature(c10::ArrayRef<c10::IValue> args) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  auto tensor = [&](const at::Tensor& t) {
    if (!t.defined()) return mix(0);
    mix(static_cast<uint64_t>(t.scalar_type()) + 1);
    for (int64_t d = 0; d < t.dim(); ++d) {
      mix(static_cast<uint64_t>(t.sizes()[d]));
      mix(static_cast<uint64_t>(t.strides()[d]));
    }
  };
  for (const c10::IValue& a : args) {
    mix(a.isNone() ? 3 : 5);
    if (a.isTensor()) tensor(a.toTensor());
    else if (a.isInt()) mix(static_cast<uint64_t>(a.toInt()));
    else if (a.isBool()) mix(a.toBool() ? 7 : 11);
    else if (a.isIntList()) for (int64_t v : a.toIntVector()) mix(static_cast<uint64_t>(v));
    else if (a.isList()) for (const c10::IValue& e : a.toListRef()) if (e.isTensor()) tensor(e.toTensor()); else mix(e.isNone());
  }
  return h;
}

} // namespace

PlaceResults::PlaceResults(const std::vector<c10::IValue>& outputs, bool enabled, PlacementHistory* history,
                           c10::ArrayRef<c10::IValue> args)
    : outputs_(outputs), history_(enabled ? history : nullptr), placing_(enabled) {
  if (!placing_) return;
  if (history_) call_ = call_signature(args);
  install();
  tls.targets.clear();
  tls.requests.clear();
  tls.placed.clear();
  std::vector<at::Tensor> ts;
  for (const auto& o : outputs) collect(o, ts);
  for (size_t i = 0; i < ts.size(); ++i) {
    const at::Tensor& t = ts[i];
    // Dense in any dimension order (channels-last, say): its memory is one
    // block of its size, starting at its data pointer.
    if (!t.defined() || t.numel() == 0 || !t.is_non_overlapping_and_dense()) continue;
    // By default the results of one size take its requests in order.
    size_t request = std::count_if(tls.targets.begin(), tls.targets.end(),
                                   [&](const Target& o) { return o.nbytes == t.nbytes(); });
    if (history_) request = history_->request(call_, i).value_or(request);
    tls.targets.push_back({t.data_ptr(), t.nbytes(), i, request});
  }
  tls.active = true;
}

PlaceResults::~PlaceResults() {
  if (placing_) tls.active = false;
}

void PlaceResults::settle(std::vector<c10::IValue> results) {
  if (placing_) tls.active = false;
  {
    std::vector<at::Tensor> from, into;
    for (const auto& r : results) collect(r, from);
    for (const auto& o : outputs_) collect(o, into);
    TORCH_INTERNAL_ASSERT(from.size() == into.size(), "kernel returned ", from.size(), " tensors, expected ",
                          into.size());
    // A result not in place may sit in memory placed for another result:
    // take it out before any copy can overwrite it.
    auto in_outputs = [&](const at::Tensor& t) {
      if (!t.defined() || !t.has_storage()) return false;
      auto* p = static_cast<const char*>(t.storage().data());
      // (The outputs' storages: an expanded one spans fewer bytes than its elements.)
      for (const at::Tensor& o : into)
        if (o.defined() && o.numel() > 0) {
          auto* b = static_cast<const char*>(o.storage().data());
          if (p >= b && p < b + o.storage().nbytes()) return true;
        }
      return false;
    };
    std::vector<bool> placed(from.size());
    int64_t in_place = 0, copied = 0;
    for (size_t i = 0; i < from.size(); ++i) {
      if (!into[i].defined() || into[i].numel() == 0) continue;
      placed[i] = same_view(from[i], into[i]);
      (placed[i] ? in_place : copied) += 1;
      if (placed[i]) continue;
      if (history_)
        if (auto r = request_of(from[i], into[i].nbytes())) history_->learn(call_, i, *r);
      if (in_outputs(from[i])) from[i] = from[i].clone();
    }
    for (size_t i = 0; i < from.size(); ++i)
      if (into[i].defined() && into[i].numel() > 0 && !placed[i]) copy_result(into[i], from[i]);
    if (placing_) {
      results_in_place.fetch_add(in_place, std::memory_order_relaxed);
      results_copied.fetch_add(copied, std::memory_order_relaxed);
    }
  }
  results.clear();
  if (!placing_) return;
  size_t kept = 0, bytes = 0;
  for (void* p : tls.placed)
    if (outstanding().contains(p)) {
      ++kept;
      for (const Target& t : tls.targets)
        if (t.data == p) bytes += t.nbytes;
    }
  tls.placed.clear();
  TORCH_INTERNAL_ASSERT(kept == 0, "a CPU kernel kept ", kept, " allocation(s) (", bytes,
                        " bytes) of device memory placed for its results after it returned; the memory "
                        "would be reused while still referenced (result_placement.h)");
}

std::pair<int64_t, int64_t> placement_counts() {
  return {results_in_place.load(std::memory_order_relaxed), results_copied.load(std::memory_order_relaxed)};
}

std::string placement_retention_error() {
  // "Device memory" here is a CPU tensor: placing only needs host-addressable
  // memory. The kernel returns its result and also keeps it.
  at::Tensor memory = at::empty({16}, at::kFloat);
  at::Tensor kept;
  std::string error;
  {
    std::vector<c10::IValue> outputs{memory};
    PlaceResults placing(outputs, /*enabled=*/true);
    kept = at::empty({16}, at::kFloat);
    try {
      placing.settle({kept});
    } catch (const c10::Error& e) {
      error = e.what_without_backtrace();
    }
  }
  kept.reset();  // gives the block back before `memory` goes
  return error;
}

} // namespace torchneuron
