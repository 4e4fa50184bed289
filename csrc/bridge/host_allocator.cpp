#include "host_allocator.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>

namespace torchneuron {
namespace {

// Host memory is page-locked on real hardware; here every page is equally
// reachable, so "pinned" is a property we track: a pinned buffer is one this
// allocator handed out. Freed buffers are cached by size for reuse.
class PinnedHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return c10::DataPtr(nullptr, c10::Device(c10::kCPU));
    size_t size = round(n);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(size);
      if (it != free_.end()) {
        p = it->second;
        free_.erase(it);
      }
    }
    if (!p) {
      p = std::aligned_alloc(kAlign, size);
      TORCH_CHECK_WITH(OutOfMemoryError, p, "out of pinned host memory allocating ", size, " bytes");
    }
    std::lock_guard<std::mutex> lock(mu_);
    live_[p] = size;
    return c10::DataPtr(p, p, &deleter, c10::Device(c10::kCPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &deleter; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  bool contains(const void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.upper_bound(ptr);  // first block starting after ptr
    if (it == live_.begin()) return false;
    --it;
    return static_cast<const char*>(ptr) < static_cast<const char*>(it->first) + it->second;
  }

  static void deleter(void* p);

 private:
  static constexpr size_t kAlign = 4096;
  static size_t round(size_t n) {
    size_t s = kAlign;
    while (s < n) s <<= 1;  // power-of-two classes make the cache reusable
    return s;
  }
  std::mutex mu_;
  std::map<const void*, size_t> live_;
  std::multimap<size_t, void*> free_;
};

PinnedHostAllocator& instance() {
  static PinnedHostAllocator* a = new PinnedHostAllocator();
  return *a;
}

void PinnedHostAllocator::deleter(void* p) {
  auto& a = instance();
  std::lock_guard<std::mutex> lock(a.mu_);
  auto it = a.live_.find(p);
  TORCH_INTERNAL_ASSERT(it != a.live_.end());
  a.free_.emplace(it->second, p);
  a.live_.erase(it);
}

} // namespace

c10::Allocator& pinned_host_allocator() { return instance(); }
bool is_pinned(const void* ptr) { return ptr && instance().contains(ptr); }

} // namespace torchneuron
