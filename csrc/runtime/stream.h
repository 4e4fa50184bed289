// An in-order queue of device tasks, run by one executor thread the runtime owns.
// Work on different streams runs concurrently; events order it.
//
// The queue is built for a host thread issuing many small tasks to an executor
// on another core. The two share nothing on the hot path but the task slots
// themselves: hosts append under a mutex that only hosts take, the executor
// claims a slot by a compare-and-swap on that slot's own state word, and the
// counters each side writes sit on cache lines of their own. Slots live in
// segments the executor hands back for reuse, so a launch allocates nothing
// that the other thread frees. (A mutex-guarded std::deque, the obvious
// queue, passes the mutex's cache line between the cores twice per task and
// frees its nodes on the thread that did not allocate them: for a tiny
// operator that costs about as much as its kernel.)
//
// Tasks that have not started stay in their slots, where a client may amend
// the newest one (amend_pending_tail); open tasks (task.h) also hear about
// frees (notify_free).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include <mutex>
#include <thread>

#include "task.h"

namespace torchneuron::runtime {

class Device;

// Called, on the waiting thread, every few tens of milliseconds while a host
// waits for a stream; it may throw to abandon the wait. The bridge sets one
// that raises KeyboardInterrupt when Ctrl-C was pressed. Null: none.
using WaitInterruptCheck = void (*)();
void set_wait_interrupt_check(WaitInterruptCheck check);
WaitInterruptCheck wait_interrupt_check();

class Stream;

// The end of a task whose work another engine carries out (gloo runs the
// neuron backend's collectives on its own threads). That engine calls
// finish() when the work is done. The task is done once its executor has
// reached it (every earlier task of the stream has run) and finish() has been
// called, and whichever of the two comes second completes it: so the
// engine's completion wakes a host waiting for the stream itself, with no
// executor woken in between. Held by the task and by the engine's callback.
class ExternalEnd {
 public:
  // From any thread; the first call counts, later ones do nothing. `error`:
  // the work failed, and becomes the device's error, named after the task.
  void finish(std::exception_ptr error = nullptr);
  // Finishes `next` (another stream's external task) once this task counts
  // as done on its stream: at once if it does already. A stream waits for
  // another this way with no executor woken on either side.
  void then(std::shared_ptr<ExternalEnd> next);

 private:
  friend class Stream;
  enum : uint32_t { kReached = 1, kFinished = 2 };
  // Sets kReached; true if that completes the task (finish() came first).
  bool reach();
  void completed();  // the task counts as done: finishes what follows it
  void finish_follower(ExternalEnd& next) const;  // a task then() made wait for this one

  // Set when the task is queued, before the executor can see it.
  Stream* stream_ = nullptr;
  uint64_t seq_ = 0;
  std::string name_;
  // A task observer (the profiler) or the memory checker must see the task
  // end before it counts as done: the executor completes it then.
  bool executor_completes_ = false;
  std::atomic<bool> called_{false};
  std::atomic<uint32_t> state_{0};
  std::exception_ptr error_;  // written before kFinished
  int64_t finished_ns_ = 0;   // likewise
  std::mutex then_mu_;
  bool completed_ = false;
  std::vector<std::shared_ptr<ExternalEnd>> next_;
};

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
  // Queues a task that ends when `end->finish()` is called, not when `run`
  // returns (`run` may be empty; it typically starts the work). A task with
  // no body queued behind finished work is reached at once: the executor is
  // not woken for it at all.
  uint64_t enqueue_external(TaskName name, TaskBody run, std::shared_ptr<ExternalEnd> end);

  // Sequence number of the newest queued task (0 if none yet).
  uint64_t last_enqueued() const { return enqueued_.load(std::memory_order_acquire); }
  bool is_complete(uint64_t seq) const { return completed_.load(std::memory_order_acquire) >= seq; }
  bool query() const { return is_complete(last_enqueued()); }

  // Blocks the calling thread until task `seq` has finished, or until
  // `deadline_ns` (now_ns's clock) has passed: returns whether the task
  // finished. Raises no device error (the device's synchronising calls do),
  // but a host waiting longer than a moment calls the wait-interrupt check
  // (set_wait_interrupt_check), which may throw to abandon the wait.
  static constexpr int64_t kNoDeadline = INT64_MAX;
  bool wait_until(uint64_t seq, int64_t deadline_ns = kNoDeadline);
  // Waits for everything queued so far, then raises a pending device error.
  void synchronize();

  // Calls `amend(task)` on the newest task if it has not started yet, with the
  // executor held off; returns what `amend` returns, or false if there is no
  // such task. The fuser merges work into a pending task this way.
  bool amend_pending_tail(const std::function<bool(Task&)>& amend);

  // Device memory [ptr, ptr + nbytes) was freed by its last owner, in this
  // stream's order: tells the newest task if it is open and has not started.
  // Costs one atomic load while no open task waits.
  void notify_free(const void* ptr, size_t nbytes);

  // Number of queued tasks not yet started (a snapshot).
  size_t pending() const;

  // Tasks queued so far that have not started are skipped: they complete
  // without running (their captures are released). For a process that is
  // exiting; their results are never computed.
  void cancel_pending();

 private:
  friend class ExternalEnd;
  struct Slot;
  struct Segment;

  uint64_t push(Task task, bool wake);  // hosts: queues it, waking a sleeping executor if `wake`
  void wake_executor();
  Slot* head_slot();       // executor: the next slot to run, or null at a segment's end
  Slot* next_task();       // executor: the next task, claimed; null once stopping and idle
  bool idle();             // executor: spins, then sleeps until work comes; false when stopping
  void run_one(Task& task);
  // executor: waits for an external task's end; true if the executor completes it
  bool await_end(ExternalEnd& end, bool give_up);
  void on_external_finished(ExternalEnd& end);  // finish() after the task was reached
  void complete(uint64_t seq);  // task `seq` counts as done; waiting hosts wake
  void record_failure(const std::string& task, std::exception_ptr error);
  void executor_loop();

  Device& device_;
  const int id_;

  // Host side: only hosts touch these, under producer_mu_.
  alignas(64) std::mutex producer_mu_;
  Segment* tail_ = nullptr;
  uint32_t tail_pos_ = 0;
  Slot* newest_ = nullptr;   // the task amend_pending_tail may change
  std::thread executor_;     // started on first enqueue

  alignas(64) std::atomic<uint64_t> enqueued_{0};  // written by hosts

  // Executor side: only the executor writes these.
  alignas(64) std::atomic<uint64_t> completed_{0};
  std::atomic<uint64_t> started_{0};
  std::atomic<uint64_t> cancelled_through_{0};  // written by hosts (cancel_pending)
  std::atomic<int64_t> open_waiting_{0};  // open tasks queued and not started (hosts add, the executor takes)
  Segment* head_ = nullptr;
  uint32_t head_pos_ = 0;

  // A consumed segment waiting to be reused (exchanged once per segment).
  alignas(64) std::atomic<Segment*> spare_{nullptr};

  // Sleeping and waking, off the hot path.
  alignas(64) std::mutex sleep_mu_;
  std::condition_variable work_cv_;  // executor waits for work
  std::condition_variable done_cv_;  // hosts wait for completion
  std::atomic<bool> executor_sleeping_{false};
  std::atomic<bool> awaiting_end_{false};  // the executor sleeps until an external task ends
  // Hosts blocked in wait_until (changed under sleep_mu_).
  std::atomic<int> host_waiters_{0};
  // The earliest task a blocked host waits for (lowered by hosts under
  // sleep_mu_, reset by the wake). An executor finishing a task takes
  // sleep_mu_ to wake hosts only once that task is done: a host waiting for
  // the last of many tasks is not woken, to look and sleep again, by each one
  // before it, which on a host with few cores takes a core from the device.
  std::atomic<uint64_t> wake_at_{kNobodyWaits};
  static constexpr uint64_t kNobodyWaits = ~uint64_t{0};
  std::atomic<bool> stopping_{false};  // set under sleep_mu_
};

} // namespace torchneuron::runtime
