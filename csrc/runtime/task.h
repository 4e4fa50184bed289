// A unit of device work. Streams run tasks in order; each carries a name (the
// operator it executes, for errors and the profiler) and device-side timestamps.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace torchneuron::runtime {

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Task {
  std::string name;
  std::function<void()> run;
  uint64_t seq = 0;          // 1-based position in its stream, set on enqueue
  int64_t enqueued_ns = 0;   // host time of the launch
  int64_t started_ns = 0;    // device time the task began
  int64_t finished_ns = 0;   // device time the task ended
  // Opaque state a client keeps with a pending task, e.g. the bridge's fuser
  // recognises its own fused tasks by it (see Stream::amend_pending_tail).
  std::shared_ptr<void> payload;
  // How long an idle executor holds this task back after its last amendment
  // while it is the stream's only task and no host waits: a fused group then
  // gets the next operator of a host still issuing them, instead of starting
  // alone and writing its result to memory for the next task to read back.
  int64_t linger_ns = 0;
  int64_t amended_ns = 0;    // host time of the launch or of the last amendment
};

// Called on the executor thread after every task (profiler feed). Must be cheap.
using TaskObserver = void (*)(int device, int stream, const Task& task);

} // namespace torchneuron::runtime
