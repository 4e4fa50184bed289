// Functional CPU kernels without an out= overload (layer norm, convolution,
// embedding backward, ...) allocate their results with the CPU allocator, and
// a device task would then copy each result into the device tensor the host
// already handed out. While a task runs such a kernel, `PlaceResults` makes the
// CPU allocator answer one request of each result's exact size with that
// result's device memory, so the kernel computes in place and the copy is
// skipped (`PlaceResults::settle`). A kernel that allocates differently (a
// scratch buffer of the same size first, another layout) still gets the right
// answer: whatever is not in place is copied, through a clone if it sits in
// placed memory.
//
// Which request: by default the first of the result's size. Some kernels ask
// for a buffer of that size before the result: oneDNN's convolution computes
// into its blocked layout, which has the result's size when the channels are a
// multiple of the vector width, and then reorders into the dense result it
// returns. A `PlacementHistory` per operator remembers which request returned
// each result last time, and the next call places that one.
//
// Safety: placed memory belongs to the device allocator, so no CPU allocation
// made of it may outlive the task. Kernels reach the CPU allocator directly
// (at::empty) and through its raw interface (oneDNN's buffers: PyTorch
// registers raw_allocate/raw_deallocate as ideep's engine allocator); a
// placed block records its release on both paths. Instrumenting the allocator
// around aten::convolution and convolution_backward (PyTorch 2.13; contiguous
// forward and backward, channels-last forward; first and later calls) showed
// every allocation other than the results given back before the call
// returns (the reordered inputs and weights, the blocked results, the
// scratchpad); the primitive caches hold no allocator memory. That is
// checked, not assumed: once the task has copied what was not in place and
// dropped the kernel's results, a placed block not given back is an internal
// error, raised with the task, while the device tensor still owns the memory. What no allocator can see, and the
// check cannot catch, is a kernel keeping a bare pointer into a result
// without a reference to its storage.
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/ivalue.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchneuron {

// What earlier calls of one operator showed: which request of its size
// returned each result (numbered in the order of the flattened outputs). The
// requests a kernel makes depend on its arguments' shapes and layouts
// (oneDNN reorders an input into a buffer that may have the result's size
// too), so answers are kept per call signature, in a direct-mapped table
// shared by the executor threads: a stale or evicted answer only costs a copy.
class PlacementHistory {
 public:
  std::optional<size_t> request(uint64_t call, size_t result) const {
    const uint64_t t = tag(call, result);
    const uint64_t e = slots_[t % slots_.size()].load(std::memory_order_relaxed);
    if (e == 0 || e >> 16 != t) return std::nullopt;
    return (e & 0xffff) - 1;
  }
  void learn(uint64_t call, size_t result, size_t request) {
    const uint64_t t = tag(call, result);
    if (request < 0xffff) slots_[t % slots_.size()].store(t << 16 | (request + 1), std::memory_order_relaxed);
  }

 private:
  static uint64_t tag(uint64_t call, size_t result) { return ((call + result) * 0x9E3779B97F4A7C15ull) >> 16; }
  std::array<std::atomic<uint64_t>, 256> slots_{};  // tag << 16 | (request + 1); 0: empty
};

// Places the results of one kernel call made on this thread between
// construction and `settle`.
class PlaceResults {
 public:
  // `outputs`: device-memory host aliases (Tensor or Tensor[] values); nothing
  // is placed unless `enabled`. `history` (may be null) is the operator's,
  // `args` the kernel's arguments.
  PlaceResults(const std::vector<c10::IValue>& outputs, bool enabled, PlacementHistory* history = nullptr,
               c10::ArrayRef<c10::IValue> args = {});
  ~PlaceResults();
  PlaceResults(const PlaceResults&) = delete;
  PlaceResults& operator=(const PlaceResults&) = delete;

  // Ends placing, copies each kernel result `results[i]` into `outputs[i]`
  // unless it is already there, drops the results and checks that every
  // placed block was given back. The caller must hold no other reference to
  // the results.
  void settle(std::vector<c10::IValue> results);

 private:
  const std::vector<c10::IValue>& outputs_;
  PlacementHistory* history_;
  uint64_t call_ = 0;  // the arguments' signature, for `history_`
  bool placing_;
};

// Results computed in place and results copied, since the process started
// (for tests).
std::pair<int64_t, int64_t> placement_counts();

// Runs the retention check on a kernel that keeps a placed allocation; returns
// the error it raises (for tests).
std::string placement_retention_error();

} // namespace torchneuron
