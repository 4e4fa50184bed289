// The device memory checker's bridge half (TORCHNEURON_MEMCHECK=1; the
// runtime half, host access protection, is runtime/memcheck.h). The
// allocator tells it about every segment and block; it
//   * poisons freed blocks and checks them when they are handed out again
//     (a write after free), in stream order: the fill and the check run on
//     the block's stream between tasks, never under a task that may still
//     use the memory;
//   * keeps a canary redzone after each block's requested bytes and checks
//     it after every task that viewed the block (an out-of-bounds write by a
//     kernel, named by the task);
//   * sees which tasks (and first calls, FirstCall) of other streams use a
//     block, and reports one that nothing orders before the memory's next
//     owner's first use (a missing record_stream), following orders between
//     streams through any chain of waits;
//   * describes host faults (runtime/memcheck.h) by the block they hit.
// Reports are queued for Python (torchneuron/sanitizers/memcheck.py), which raises them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <string>
#include <vector>

#include "runtime/memcheck.h"
#include "../allocator.h"

namespace torchneuron::memcheck {

using runtime::memcheck::on;

// The canary redzone every block keeps after its requested bytes.
constexpr size_t kRedzone = 256;
inline size_t padded(size_t requested) { return on() ? requested + kRedzone : requested; }

// A host thread's scope of legitimate device access (runtime DeviceAccess),
// which also runs the poison fills and checks its device's idle streams owe.
class HostAccess {
 public:
  HostAccess() {
    if (on()) settle();
  }

 private:
  static void settle();
  runtime::memcheck::DeviceAccess access_;
};

// Allocator events (call without the allocator's lock where it says so).
void segment_mapped(int device, char* p, size_t bytes);  // fresh: poisoned now
void segment_unmapped(int device, char* p, size_t bytes);
void block_allocated(int device, int stream, char* p, size_t size, size_t requested, HistoryContext context);
void block_freed(char* p, HistoryContext context);
void block_released(int device, int stream, char* p, size_t size);  // back in its pool, reusable
void block_recorded(char* p, int stream);                           // record_stream
// Names a fresh tensor's block by the tensor ("a (4, 3) float32 tensor"):
// the allocator sees bytes, reports name what the program made. Every
// factory of device tensors returns through it, and every resize that
// allocates anew.
void name_block(const at::Tensor& fresh);
inline const at::Tensor& named(const at::Tensor& fresh) {
  if (on()) name_block(fresh);
  return fresh;
}

// Executor: a task views device memory starting at `data`; also a
// FirstCall's host thread.
void viewed(const void* data);

// The scope of a call signature's first call (exec/executor.cpp), which runs
// synchronously on the host once its stream is idle. When the signature's
// later calls queue (queues_later()), the call's uses of device memory count
// as its stream's work after the stream's newest task: so a missing
// record_stream is found at the first call too, not only once the signature
// is warm and its task happens to run after the free. A call that raised, or
// whose signature stays synchronous, counts for nothing: every such call is
// over before the program can free what it used. Nests; the outermost scope
// counts.
class FirstCall {
 public:
  FirstCall(c10::DeviceIndex device, const std::string& op) {
    if (on()) begin(device, op);
  }
  ~FirstCall() {
    if (on()) end(queues_);
  }
  FirstCall(const FirstCall&) = delete;
  FirstCall& operator=(const FirstCall&) = delete;
  void queues_later() { queues_ = true; }

 private:
  static void begin(c10::DeviceIndex device, const std::string& op);
  static void end(bool queues);
  bool queues_ = false;
};

// The calling thread's OpenMP workers get access for their life: they run
// the parallel regions of the kernels its DeviceAccess scopes run.
void grant_parallel_workers();

// Stacks for reports: the allocator history's gathering function.
void set_gather(GatherContextFn gather);
HistoryContext gather_stack();  // null until set

struct Report {
  std::string kind;     // "host access", "write after free", "out of bounds", "missing record_stream"
  std::string message;
  std::vector<std::pair<std::string, HistoryContext>> stacks;  // titled
  bool python_stack = false;  // the place it happened is the current Python stack
};
std::vector<Report> take_reports();
// Called (from any thread, also a signal handler) when reports are waiting.
void set_report_notifier(void (*notify)());

struct Stats {
  size_t poisoned = 0, checked = 0, unchecked = 0, canary_checks = 0, reports = 0;
};
Stats stats();

} // namespace torchneuron::memcheck
