// The caching device allocator for `neuron`, registered as PyTorch's
// c10::DeviceAllocator for PrivateUse1.
//
// Design (that of CUDA's caching allocator, which users' expectations are
// built on): segments are mapped from the runtime and carved into blocks;
// freed blocks stay cached per stream. A free is stream-ordered: the block
// returns to its stream's pool at once, and the next allocation on that stream
// may reuse it, which is safe because that stream runs its work in order. A
// tensor used on another stream must be recorded there (record_stream); its
// block then waits for those streams' events before it is reused.
//   small pool: requests <= 1 MiB, from 2 MiB segments
//   large pool: bigger requests, from 20 MiB segments (or exact 2 MiB multiples)
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include <memory>
#include <string>
#include <vector>

namespace torchneuron {

// Where an allocator event came from (a Python and C++ stack trace, for
// torch.cuda.memory._record_memory_history's "frames"); gathered by a
// function the Python binding installs, so the allocator needs no Python.
using HistoryContext = std::shared_ptr<c10::GatheredContext>;
using GatherContextFn = HistoryContext (*)();
// Which frames a history keeps, as CUDA's `context` option: none, those of
// live allocations (State), also those of allocation events (Alloc), and
// also those of frees (All).
enum class HistoryFrames { None, State, Alloc, All };

struct BlockSnapshot {
  size_t size, requested_size;
  bool allocated, active;
  HistoryContext context;  // the allocation's, while recording with frames
};
struct SegmentSnapshot {
  int device;
  size_t address, total_size, allocated_size, active_size, requested_size;
  int stream;
  bool is_large;
  std::vector<BlockSnapshot> blocks;
};
struct TraceSnapshot {  // allocator history for the memory visualizer
  std::string action;
  size_t address, size;
  int stream;
  int64_t time_us;
  HistoryContext context;
};

class NeuronCachingAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  std::vector<SegmentSnapshot> snapshot();
  std::vector<TraceSnapshot> trace(c10::DeviceIndex device);
  // Starts (or, with enabled false, stops and clears) the history;
  // `gather` (null: no frames) is called outside the allocator's locks.
  void record_history(bool enabled, HistoryFrames frames = HistoryFrames::None, GatherContextFn gather = nullptr);
};

NeuronCachingAllocator& device_allocator();

} // namespace torchneuron
