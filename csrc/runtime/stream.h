// An in-order queue of device tasks, run by one executor thread the runtime owns.
// Work on different streams runs concurrently; events order it.
//
// Tasks that have not started stay in the queue, where the bridge's fuser may
// inspect and amend the newest one (amend_pending_tail).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "task.h"

namespace torchneuron::runtime {

class Device;

class Stream {
 public:
  Stream(Device& device, int id);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  int id() const { return id_; }
  Device& device() const { return device_; }

  // Queues a task and returns its sequence number. Under NEURON_LAUNCH_BLOCKING
  // the task has run (and any error has been raised) when this returns.
  uint64_t enqueue(Task task);
  uint64_t enqueue(TaskName name, TaskBody run);

  // Sequence number of the newest queued task (0 if none yet).
  uint64_t last_enqueued() const { return enqueued_.load(std::memory_order_acquire); }
  bool is_complete(uint64_t seq) const { return completed_.load(std::memory_order_acquire) >= seq; }
  bool query() const { return is_complete(last_enqueued()); }

  // Blocks the calling thread until task `seq` has finished. Raises nothing:
  // errors are raised by the device's synchronising calls.
  void wait_until(uint64_t seq);
  // Waits for everything queued so far, then raises a pending device error.
  void synchronize();

  // Calls `amend(task)` on the newest task if it has not started yet, with the
  // executor held off; returns what `amend` returns, or false if there is no
  // such task. The fuser merges work into a pending task this way.
  bool amend_pending_tail(const std::function<bool(Task&)>& amend);

  // Number of queued tasks not yet started (a snapshot).
  size_t pending() const;

 private:
  void run_one(Task& task);
  void executor_loop();

  Device& device_;
  const int id_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // executor waits for work
  std::condition_variable done_cv_;  // hosts wait for completion
  std::deque<Task> queue_;
  std::atomic<uint64_t> enqueued_{0};
  std::atomic<uint64_t> completed_{0};
  // Hosts blocked in wait_until (changed under mu_). An executor finishing a
  // task takes mu_ to wake them only when there are any.
  std::atomic<int> host_waiters_{0};
  bool executor_sleeping_ = false;   // guarded by mu_
  bool stopping_ = false;            // guarded by mu_
  std::thread executor_;             // started on first enqueue
};

} // namespace torchneuron::runtime
