#include "host_allocator.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "device_state.h"
#include "runtime/event.h"

namespace torchneuron {
namespace {

using Clock = std::chrono::steady_clock;

int64_t micros_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
}

// Host memory is page-locked on real hardware; here every page is equally
// reachable, so "pinned" is a property we track: a pinned buffer is one this
// allocator handed out. Blocks come in power-of-two sizes and are cached when
// freed. A block whose use a caller recorded on a stream (record_event, as
// with CUDA's caching host allocator) waits until the stream has passed that
// point before it is handed out again. The device's own non-blocking copies
// need no record: their tasks hold the tensors (ops/copy.cpp).
class PinnedHostAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return c10::DataPtr(nullptr, c10::Device(c10::kCPU));
    // As CUDA's pinned memory, which needs the device: a child forked after
    // the device started gets the fork error (its frees are no-ops, below).
    if (rt::in_bad_fork()) ensure_initialized();
    const size_t size = round(n);
    std::unique_lock<std::mutex> lock(mu_);
    release_finished_uses();
    void* p = nullptr;
    if (auto it = free_.find(size); it != free_.end()) {
      p = it->second;
      free_.erase(it);
    } else {
      lock.unlock();
      const auto start = Clock::now();
      p = std::aligned_alloc(kAlign, size);
      TORCH_CHECK_WITH(OutOfMemoryError, p, "out of pinned host memory allocating ", size, " bytes");
      const int64_t took = micros_since(start);
      lock.lock();
      blocks_[p] = Block{size};
      stats_.allocations.increase(1);
      stats_.allocated_bytes.increase(size);
      stats_.host_alloc_time.increase(took);
      ++stats_.num_host_alloc;
    }
    blocks_[p].handed_out = true;
    stats_.active_requests.increase(1);
    stats_.active_bytes.increase(size);
    return c10::DataPtr(p, p, &deleter, c10::Device(c10::kCPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &deleter; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(ctx ? ctx : ptr);
    if (it == blocks_.end() || !it->second.handed_out) return false;
    auto use = std::make_shared<rt::Event>();
    use->record(runtime_stream(stream));
    it->second.uses.push_back(std::move(use));
    return true;
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    release_finished_uses();
    for (auto& [size, p] : free_) {
      const auto start = Clock::now();
      std::free(p);
      stats_.host_free_time.increase(micros_since(start));
      ++stats_.num_host_free;
      stats_.allocations.decrease(1);
      stats_.allocated_bytes.decrease(size);
      blocks_.erase(p);
    }
    free_.clear();
  }

  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto* s : {&stats_.allocations, &stats_.allocated_bytes, &stats_.active_requests, &stats_.active_bytes})
      s->reset_accumulated();
    stats_.host_alloc_time = {};
    stats_.host_free_time = {};
    stats_.num_host_alloc = stats_.num_host_free = 0;
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto* s : {&stats_.allocations, &stats_.allocated_bytes, &stats_.active_requests, &stats_.active_bytes})
      s->reset_peak();
  }

  bool contains(const void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.upper_bound(const_cast<void*>(ptr));  // first block starting after ptr
    if (it == blocks_.begin()) return false;
    --it;
    return it->second.handed_out && static_cast<const char*>(ptr) < static_cast<const char*>(it->first) + it->second.size;
  }

  static void deleter(void* p);

 private:
  struct Block {
    size_t size = 0;
    bool handed_out = false;
    std::vector<std::shared_ptr<rt::Event>> uses;  // streams' uses since it was handed out
  };

  static constexpr size_t kAlign = 4096;
  static size_t round(size_t n) {
    size_t s = kAlign;
    while (s < n) s <<= 1;  // power-of-two classes make the cache reusable
    return s;
  }

  // A freed block goes back to the cache once its streams have passed their
  // recorded uses. Called with mu_ held.
  void release(void* p, Block& b) {
    b.handed_out = false;
    b.uses.clear();
    free_.emplace(b.size, p);
    stats_.active_requests.decrease(1);
    stats_.active_bytes.decrease(b.size);
  }
  void release_finished_uses() {
    for (size_t i = 0; i < in_use_.size();) {
      Block& b = blocks_.at(in_use_[i]);
      bool finished = true;
      for (const auto& use : b.uses) finished &= use->query();
      if (!finished) {
        ++i;
        continue;
      }
      release(in_use_[i], b);
      in_use_[i] = in_use_.back();
      in_use_.pop_back();
    }
  }

  std::mutex mu_;
  std::map<void*, Block> blocks_;      // every block the allocator owns, by address
  std::multimap<size_t, void*> free_;  // cached blocks, by size
  std::vector<void*> in_use_;          // freed blocks a stream may still be using
  at::HostStats stats_;
};

PinnedHostAllocator& instance() {
  static PinnedHostAllocator* a = new PinnedHostAllocator();  // never destroyed: blocks outlive statics
  return *a;
}

void PinnedHostAllocator::deleter(void* p) {
  // In a child forked after the device started, the cache and its lock are
  // copies of the parent's at the fork, and a block's recorded uses are the
  // parent's streams: the child keeps its copy of the buffer until it exits.
  if (rt::in_bad_fork()) return;
  auto& a = instance();
  std::lock_guard<std::mutex> lock(a.mu_);
  auto it = a.blocks_.find(p);
  TORCH_INTERNAL_ASSERT(it != a.blocks_.end() && it->second.handed_out);
  if (it->second.uses.empty()) a.release(p, it->second);
  else a.in_use_.push_back(p);
}

} // namespace

at::HostAllocator& pinned_host_allocator() { return instance(); }
bool is_pinned(const void* ptr) { return ptr && instance().contains(ptr); }

} // namespace torchneuron

REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &torchneuron::pinned_host_allocator())
