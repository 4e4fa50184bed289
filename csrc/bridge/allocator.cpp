// The caching device allocator (allocator.h): per-device caches of segments
// carved into blocks, the small and large pools with their size classes, the
// stream-ordered free (record_stream defers reuse behind other streams'
// events), CUDA's statistics, snapshots and the trace of allocations.
#include "allocator.h"

#include <c10/core/DeviceType.h>
#include <c10/core/impl/COWDeleter.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>

#include "device_state.h"
#include "sanitizers/memcheck.h"
#include "sanitizers/stream_sanitizer.h"

namespace torchneuron {
namespace {

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;

constexpr size_t kMinBlock = 512;             // every block is a multiple of this
constexpr size_t kSmallRequest = 1 << 20;     // small pool: <= 1 MiB
constexpr size_t kSmallSegment = 2 << 20;
constexpr size_t kLargeSegment = 20 << 20;
constexpr size_t kMinLargeAlloc = 10 << 20;   // larger requests get their own segment
constexpr size_t kSegmentRound = 2 << 20;

size_t round_size(size_t n) { return n < kMinBlock ? kMinBlock : (n + kMinBlock - 1) / kMinBlock * kMinBlock; }

struct Block {
  int device = 0;
  int stream = 0;
  size_t size = 0;
  char* ptr = nullptr;
  bool large = false;
  size_t requested = 0;
  // What its allocation counts in the statistics: its size less the memory
  // checker's redzone, so that a program reads the figures it reads unchecked.
  size_t counted = 0;
  bool allocated = false;
  Block* prev = nullptr;  // neighbours within the segment
  Block* next = nullptr;
  std::vector<int> used_on;  // other streams (record_stream)
  int pending_events = 0;    // events that must complete before reuse
  HistoryContext context;    // where it was allocated, while a history records frames
};

struct BlockOrder {  // pools are searched by (stream, size), ties by address
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};

struct DeviceCache {
  std::mutex mu;
  std::set<Block*, BlockOrder> small_pool, large_pool;
  std::set<Block*> segments;  // the first block of each segment
  std::deque<std::pair<std::unique_ptr<rt::Event>, Block*>> deferred;
  DeviceStats stats;
  bool record_history = false;
  std::vector<TraceSnapshot> history;

  std::set<Block*, BlockOrder>& pool(const Block* b) { return b->large ? large_pool : small_pool; }
};

DeviceCache& cache(int device) {
  static std::array<DeviceCache, rt::kMaxDevices> caches;
  return caches.at(device);
}

using StatField = c10::CachingAllocator::StatArray DeviceStats::*;

void increase(DeviceCache& c, bool large, StatField f, size_t amount) {
  (c.stats.*f)[size_t(StatType::AGGREGATE)].increase(amount);
  (c.stats.*f)[size_t(large ? StatType::LARGE_POOL : StatType::SMALL_POOL)].increase(amount);
}
void decrease(DeviceCache& c, bool large, StatField f, size_t amount) {
  (c.stats.*f)[size_t(StatType::AGGREGATE)].decrease(amount);
  (c.stats.*f)[size_t(large ? StatType::LARGE_POOL : StatType::SMALL_POOL)].decrease(amount);
}

// torch.profiler's profile_memory: each allocation and free with the
// device's totals afterwards (call with c.mu held).
void report_to_profiler(DeviceCache& c, const void* ptr, int64_t delta, int device) {
  if (!c10::memoryProfilingEnabled()) return;
  const auto total = [&](StatField f) { return (c.stats.*f)[size_t(StatType::AGGREGATE)].current; };
  c10::reportMemoryUsageToProfiler(const_cast<void*>(ptr), delta, total(&DeviceStats::allocated_bytes),
                                   total(&DeviceStats::reserved_bytes), c10::Device(kNeuron, device));
}

// The history's frame gathering, read without a lock on every allocation
// and free: null unless a history records frames.
std::atomic<GatherContextFn> gather_alloc_context{nullptr}, gather_free_context{nullptr};
std::atomic<bool> alloc_events_keep_frames{false};

HistoryContext gather(const std::atomic<GatherContextFn>& fn) {
  GatherContextFn f = fn.load(std::memory_order_relaxed);
  return f ? f() : nullptr;
}

void trace(DeviceCache& c, const char* action, const void* ptr, size_t size, int stream,
           HistoryContext context = nullptr) {
  if (c.record_history)
    c.history.push_back(
        {action, reinterpret_cast<size_t>(ptr), size, stream, rt::now_ns() / 1000, std::move(context)});
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / (1 << 20));
  return buf;
}

// Merges a free block with its free neighbours and returns it to its pool.
// A neighbour's pool node is taken out whole and reused for the merged block:
// blocks of a segment share a pool, and a tiny operator's alloc/free pair
// then costs the pool no tree-node allocation.
void release_block(DeviceCache& c, Block* b) {
  if (memcheck::on()) memcheck::block_released(b->device, b->stream, b->ptr, b->size);
  decrease(c, b->large, &DeviceStats::active, 1);
  decrease(c, b->large, &DeviceStats::active_bytes, b->counted);
  trace(c, "free_completed", b->ptr, b->size, b->stream);
  auto& pool = c.pool(b);
  decltype(pool.extract(b)) node;
  if (Block* n = b->next; n && !n->allocated && n->pending_events == 0) {
    node = pool.extract(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    delete n;
  }
  if (Block* p = b->prev; p && !p->allocated && p->pending_events == 0) {
    node = pool.extract(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    delete b;
    b = p;
  }
  if (node.empty()) return void(pool.insert(b));
  node.value() = b;
  pool.insert(std::move(node));
}

void process_deferred(DeviceCache& c, bool all_done) {
  while (!c.deferred.empty()) {
    auto& [event, block] = c.deferred.front();
    if (!all_done && !event->query()) break;
    Block* b = block;
    c.deferred.pop_front();
    if (--b->pending_events == 0) release_block(c, b);
  }
}

// Returns fully free segments to the runtime. Waits for the device first: a
// cached block may still be in use by queued work of its stream.
void release_cached(int device, std::unique_lock<std::mutex>& lock) {
  DeviceCache& c = cache(device);
  lock.unlock();
  translate_errors([&] { rt::device(device).synchronize(); });
  lock.lock();
  process_deferred(c, true);
  for (auto it = c.segments.begin(); it != c.segments.end();) {
    Block* b = *it;
    if (b->allocated || b->next || b->pending_events > 0) {
      ++it;
      continue;
    }
    c.pool(b).erase(b);
    decrease(c, b->large, &DeviceStats::segment, 1);
    decrease(c, b->large, &DeviceStats::reserved_bytes, b->size);
    trace(c, "segment_free", b->ptr, b->size, b->stream);
    if (memcheck::on()) memcheck::segment_unmapped(device, b->ptr, b->size);
    rt::device(device).unmap(b->ptr);
    delete b;
    it = c.segments.erase(it);
  }
}

char* map_segment(DeviceCache& c, int device, size_t seg, size_t size, std::unique_lock<std::mutex>& lock) {
  try {
    return static_cast<char*>(rt::device(device).map(seg));
  } catch (const rt::OutOfMemoryError&) {
  }
  // Out of memory: return the cache to the device and try once more.
  ++c.stats.num_alloc_retries;
  release_cached(device, lock);
  try {
    return static_cast<char*>(rt::device(device).map(seg));
  } catch (const rt::OutOfMemoryError& e) {
    ++c.stats.num_ooms;
    trace(c, "oom", nullptr, size, 0);
    double allocated = double(c.stats.allocated_bytes[0].current);
    double reserved = double(c.stats.reserved_bytes[0].current);
    TORCH_CHECK_WITH(OutOfMemoryError, false, "neuron:", device, " out of memory. Tried to allocate ",
                     mib(double(size)), ". The device has a total capacity of ", mib(double(e.capacity)),
                     " of which ", mib(double(e.capacity - e.in_use)), " is free. Of the allocated memory ",
                     mib(allocated), " is allocated by PyTorch, and ", mib(reserved - allocated),
                     " is reserved by PyTorch but unallocated. TORCHNEURON_HBM_BYTES sets the capacity.");
  }
}

Block* malloc_block(int device, int stream, size_t requested, HistoryContext context) {
  DeviceCache& c = cache(device);
  std::unique_lock<std::mutex> lock(c.mu);
  process_deferred(c, false);
  const size_t size = round_size(memcheck::padded(requested));
  const bool large = size > kSmallRequest;
  auto& pool = large ? c.large_pool : c.small_pool;
  Block key;
  key.stream = stream;
  key.size = size;
  Block* b;
  decltype(pool.extract(pool.begin())) node;  // reused for the split-off tail, if any
  if (auto it = pool.lower_bound(&key); it != pool.end() && (*it)->stream == stream) {
    b = *it;
    node = pool.extract(it);
  } else {
    size_t seg = !large ? kSmallSegment
               : size < kMinLargeAlloc ? kLargeSegment
               : (size + kSegmentRound - 1) / kSegmentRound * kSegmentRound;
    b = new Block;
    b->ptr = map_segment(c, device, seg, size, lock);
    if (memcheck::on()) memcheck::segment_mapped(device, b->ptr, seg);
    b->device = device;
    b->stream = stream;
    b->size = seg;
    b->large = large;
    c.segments.insert(b);
    increase(c, large, &DeviceStats::segment, 1);
    increase(c, large, &DeviceStats::reserved_bytes, seg);
    trace(c, "segment_alloc", b->ptr, seg, stream,
          alloc_events_keep_frames.load(std::memory_order_relaxed) ? context : nullptr);
  }
  // Split off the remainder when it is worth keeping as a block of its own.
  if (size_t rest = b->size - size; large ? rest > kSmallRequest : rest >= kMinBlock) {
    Block* tail = new Block(*b);
    tail->ptr = b->ptr + size;
    tail->size = rest;
    tail->prev = b;
    if (b->next) b->next->prev = tail;
    b->next = tail;
    b->size = size;
    if (node.empty()) {
      pool.insert(tail);
    } else {
      node.value() = tail;
      pool.insert(std::move(node));
    }
  }
  b->allocated = true;
  b->requested = requested;
  b->counted = b->size - (size - round_size(requested));
  increase(c, large, &DeviceStats::allocation, 1);
  increase(c, large, &DeviceStats::allocated_bytes, b->counted);
  increase(c, large, &DeviceStats::active, 1);
  increase(c, large, &DeviceStats::active_bytes, b->counted);
  increase(c, large, &DeviceStats::requested_bytes, requested);
  trace(c, "alloc", b->ptr, b->size, stream, alloc_events_keep_frames.load(std::memory_order_relaxed) ? context : nullptr);
  b->context = std::move(context);
  report_to_profiler(c, b->ptr, static_cast<int64_t>(b->counted), device);
  return b;
}

// Allocated blocks by address. A DataPtr's context is its own address, as
// on CUDA: copy-on-write storages (torch._lazy_clone) wrap only such a
// "simple" context and hand it back on materialisation expecting the
// address, and raw_allocate/raw_delete need it too. The deleter and
// record_stream find the block here. Sharded so that frees on different
// threads rarely meet on one lock.
class LiveBlocks {
 public:
  void add(Block* b) {
    Shard& s = shard(b->ptr);
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.spare.empty()) {
      s.blocks.emplace(b->ptr, b);
      return;
    }
    s.spare.key() = b->ptr;
    s.spare.mapped() = b;
    s.blocks.insert(std::move(s.spare));
  }
  // The block allocated at `ptr`, removed when `take`; null if none is.
  Block* find(const void* ptr, bool take) {
    Shard& s = shard(ptr);
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.blocks.find(ptr);
    if (it == s.blocks.end()) return nullptr;
    Block* b = it->second;
    if (take) {
      auto node = s.blocks.extract(it);
      if (s.spare.empty()) s.spare = std::move(node);
    }
    return b;
  }

 private:
  using Map = std::unordered_map<const void*, Block*>;
  struct Shard {
    std::mutex mu;
    Map blocks;
    // The node of the last block taken, for the next one added: a tiny
    // operator's output is freed and its block allocated again at every
    // step, and the node's heap block would go with it.
    Map::node_type spare;
  };
  static constexpr size_t kShards = 16;
  std::array<Shard, kShards> shards_;
  // Blocks start at multiples of kMinBlock.
  Shard& shard(const void* p) { return shards_[(reinterpret_cast<uintptr_t>(p) / kMinBlock) % kShards]; }
};

LiveBlocks& live_blocks() {
  static LiveBlocks* l = new LiveBlocks();  // never destroyed: deleters may run during exit
  return *l;
}

void free_block(void* ptr) {
  // A child forked after the device started frees its copy of the parent's
  // tensors: the memory is the parent's, and the cache, streams and locks
  // are copies of the parent's state at the fork (a lock may be held by a
  // thread the child does not have). Nothing to do.
  if (rt::in_bad_fork()) return;
  Block* b = live_blocks().find(ptr, /*take=*/true);
  TORCH_INTERNAL_ASSERT(b, "neuron allocator: freeing ", ptr, ", which it did not allocate");
  // The stream's waiting work hears of the free: a temporary that a pending
  // fused task produces need then never be written. Only single-stream
  // blocks: another stream may still read a recorded one.
  if (b->used_on.empty()) rt::device(b->device).stream(b->stream).notify_free(b->ptr, b->size);
  HistoryContext context = gather(gather_free_context);
  if (memcheck::on()) memcheck::block_freed(b->ptr, context ? context : memcheck::gather_stack());
  sanitizer::log_free(b->device, b->stream, b->ptr, b->size, b->used_on);
  DeviceCache& c = cache(b->device);
  std::lock_guard<std::mutex> lock(c.mu);
  b->allocated = false;
  b->context.reset();
  decrease(c, b->large, &DeviceStats::allocation, 1);
  decrease(c, b->large, &DeviceStats::allocated_bytes, b->counted);
  decrease(c, b->large, &DeviceStats::requested_bytes, b->requested);
  trace(c, "free_requested", b->ptr, b->size, b->stream, std::move(context));
  report_to_profiler(c, b->ptr, -static_cast<int64_t>(b->counted), b->device);
  if (b->used_on.empty()) return release_block(c, b);
  // Used on other streams too: reusable once each of them reaches this point.
  for (int s : b->used_on) {
    auto e = std::make_unique<rt::Event>();
    e->record(rt::device(b->device).stream(s));
    c.deferred.emplace_back(std::move(e), b);
    ++b->pending_events;
  }
  b->used_on.clear();
}

} // namespace

c10::DataPtr NeuronCachingAllocator::allocate(size_t nbytes) {
  c10::DeviceIndex device = current_device();
  ensure_initialized();
  if (nbytes == 0) return c10::DataPtr(nullptr, c10::Device(kNeuron, device));
  int stream = static_cast<int>(current_stream(device).id());
  HistoryContext context = gather(gather_alloc_context);
  // The memory checker's stacks are its own: the history keeps what it was asked to.
  HistoryContext checked = memcheck::on() ? (context ? context : memcheck::gather_stack()) : nullptr;
  Block* b = translate_errors([&] { return malloc_block(device, stream, nbytes, std::move(context)); });
  if (memcheck::on()) memcheck::block_allocated(device, stream, b->ptr, b->size, nbytes, std::move(checked));
  live_blocks().add(b);
  return c10::DataPtr(b->ptr, b->ptr, free_block, c10::Device(kNeuron, device));
}

c10::DeleterFnPtr NeuronCachingAllocator::raw_deleter() const { return free_block; }

void NeuronCachingAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  // Storage-level copies: a copy-on-write storage materialising on write
  // (Allocator::clone), serialization helpers. The source may have been
  // written on any stream of its device (a lazy clone is materialised on the
  // stream of the write that needs it, not that of the work that produced
  // the data), so the copy waits for the whole device.
  const Block* b = live_blocks().find(src, /*take=*/false);
  const int device = b ? b->device : current_device();
  translate_errors([&] { rt::device(device).synchronize(); });
  memcheck::HostAccess access;
  std::memcpy(dest, src, count);
}

void NeuronCachingAllocator::emptyCache(c10::MempoolId_t) {
  for (int d = 0; d < device_count(); ++d) {
    DeviceCache& c = cache(d);
    std::unique_lock<std::mutex> lock(c.mu);
    release_cached(d, lock);
  }
}

void NeuronCachingAllocator::recordStream(const c10::DataPtr& ptr, c10::Stream stream) {
  // Only whole allocations are tracked (a view's data pointer is not), as on
  // CUDA; a copy-on-write storage's DataPtr wraps the allocation it shares.
  if (ptr.get_deleter() != free_block && ptr.get_deleter() != c10::impl::cow::cow_deleter) return;
  Block* b = live_blocks().find(ptr.get(), /*take=*/false);
  if (!b) return;
  DeviceCache& c = cache(b->device);
  std::lock_guard<std::mutex> lock(c.mu);
  int s = static_cast<int>(stream.id());
  if (s != b->stream && std::find(b->used_on.begin(), b->used_on.end(), s) == b->used_on.end()) {
    b->used_on.push_back(s);
    if (memcheck::on()) memcheck::block_recorded(b->ptr, s);
  }
}

DeviceStats NeuronCachingAllocator::getDeviceStats(c10::DeviceIndex device) {
  check_device_index(device);
  DeviceCache& c = cache(device);
  std::lock_guard<std::mutex> lock(c.mu);
  DeviceStats stats = c.stats;
  // Free blocks of partly used segments: derived on demand rather than tracked.
  for (Block* head : c.segments) {
    if (!head->next) continue;
    for (Block* b = head; b; b = b->next)
      if (!b->allocated && b->pending_events == 0) {
        auto& n = stats.inactive_split[0], &nb = stats.inactive_split_bytes[0];
        n.increase(1);
        nb.increase(b->size);
        (b->large ? stats.inactive_split[2] : stats.inactive_split[1]).increase(1);
        (b->large ? stats.inactive_split_bytes[2] : stats.inactive_split_bytes[1]).increase(b->size);
      }
  }
  return stats;
}

namespace {
template <class F>
void for_each_stat(DeviceStats& st, F&& f) {
  for (auto* arr : {&st.allocation, &st.segment, &st.active, &st.inactive_split, &st.allocated_bytes,
                    &st.reserved_bytes, &st.active_bytes, &st.inactive_split_bytes, &st.requested_bytes})
    for (auto& s : *arr) f(s);
}
} // namespace

void NeuronCachingAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  check_device_index(device);
  DeviceCache& c = cache(device);
  std::lock_guard<std::mutex> lock(c.mu);
  for_each_stat(c.stats, [](Stat& s) { s.reset_accumulated(); });
  c.stats.num_alloc_retries = 0;
  c.stats.num_ooms = 0;
}

void NeuronCachingAllocator::resetPeakStats(c10::DeviceIndex device) {
  check_device_index(device);
  DeviceCache& c = cache(device);
  std::lock_guard<std::mutex> lock(c.mu);
  for_each_stat(c.stats, [](Stat& s) { s.reset_peak(); });
}

std::pair<size_t, size_t> NeuronCachingAllocator::getMemoryInfo(c10::DeviceIndex device) {
  check_device_index(device);
  auto& d = rt::device(device);
  return {d.capacity() - d.mapped_bytes(), d.capacity()};
}

std::vector<SegmentSnapshot> NeuronCachingAllocator::snapshot() {
  std::vector<SegmentSnapshot> out;
  for (int d = 0; d < device_count(); ++d) {
    DeviceCache& c = cache(d);
    std::lock_guard<std::mutex> lock(c.mu);
    for (Block* head : c.segments) {
      SegmentSnapshot s{d, reinterpret_cast<size_t>(head->ptr), 0, 0, 0, 0, head->stream, head->large, {}};
      for (Block* b = head; b; b = b->next) {
        bool active = b->allocated || b->pending_events > 0;
        s.blocks.push_back({b->size, b->allocated ? b->requested : 0, b->allocated, active, b->context});
        s.total_size += b->size;
        if (b->allocated) s.allocated_size += b->size, s.requested_size += b->requested;
        if (active) s.active_size += b->size;
      }
      out.push_back(std::move(s));
    }
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.address < b.address; });
  return out;
}

std::vector<TraceSnapshot> NeuronCachingAllocator::trace(c10::DeviceIndex device) {
  check_device_index(device);
  DeviceCache& c = cache(device);
  std::lock_guard<std::mutex> lock(c.mu);
  return c.history;
}

void NeuronCachingAllocator::record_history(bool enabled, HistoryFrames frames, GatherContextFn gather) {
  if (!enabled) frames = HistoryFrames::None;
  gather_alloc_context.store(frames != HistoryFrames::None ? gather : nullptr);
  gather_free_context.store(frames == HistoryFrames::All ? gather : nullptr);
  alloc_events_keep_frames.store(frames == HistoryFrames::Alloc || frames == HistoryFrames::All);
  for (int d = 0; d < device_count(); ++d) {
    DeviceCache& c = cache(d);
    std::lock_guard<std::mutex> lock(c.mu);
    c.record_history = enabled;
    if (!enabled) {
      c.history.clear();
      for (Block* head : c.segments)
        for (Block* b = head; b; b = b->next) b->context.reset();
    }
  }
}

NeuronCachingAllocator& device_allocator() {
  static NeuronCachingAllocator* a = new NeuronCachingAllocator();
  return *a;
}

namespace {
struct RegisterAllocator {
  RegisterAllocator() { c10::SetAllocator(kNeuron, &device_allocator()); }
} register_allocator;
} // namespace

} // namespace torchneuron
