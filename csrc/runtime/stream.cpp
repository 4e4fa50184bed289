#include "stream.h"

#include <chrono>
#include <exception>

#include "device.h"
#include "errors.h"

namespace torchneuron::runtime {

namespace {
constexpr int64_t kSpinNs = 50'000;
} // namespace

Stream::Stream(Device& device, int id) : device_(device), id_(id) {}

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (executor_.joinable()) executor_.join();
}

uint64_t Stream::enqueue(TaskName name, TaskBody run) {
  Task task;
  task.name = std::move(name);
  task.run = std::move(run);
  return enqueue(std::move(task));
}

uint64_t Stream::enqueue(Task task) {
  task.enqueued_ns = task.amended_ns = now_ns();
  if (device_.launch_blocking()) {
    // Debug mode: run here and now, after everything before it, and report
    // an error at the launch that caused it.
    std::unique_lock<std::mutex> lock(mu_);
    task.seq = enqueued_.load() + 1;
    enqueued_.store(task.seq, std::memory_order_release);
    ++host_waiters_;
    done_cv_.wait(lock, [&] { return completed_.load() + 1 == task.seq; });
    --host_waiters_;
    lock.unlock();
    run_one(task);
    device_.raise_pending_error();
    return task.seq;
  }
  bool wake;
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seq = task.seq = enqueued_.load() + 1;
    queue_.push_back(std::move(task));
    enqueued_.store(seq, std::memory_order_release);
    if (!executor_.joinable()) executor_ = std::thread([this] { executor_loop(); });
    wake = executor_sleeping_;
  }
  if (wake) work_cv_.notify_one();
  return seq;
}

void Stream::run_one(Task& task) {
  task.started_ns = now_ns();
  try {
    task.run();
  } catch (const std::exception& e) {
    device_.record_error(AsyncError(device_.index(), id_, task.name.str(), e.what()));
  } catch (...) {
    device_.record_error(AsyncError(device_.index(), id_, task.name.str(), "unknown exception"));
  }
  task.finished_ns = now_ns();
  device_.observe(id_, task);
  task.run = nullptr;  // release captures before the task counts as done
  task.payload.reset();
  // Without the lock unless a host waits: a waiter registers (under the lock)
  // before it reads completed_, and both sides' accesses are sequentially
  // consistent, so either this sees the waiter or the waiter sees this store.
  completed_.store(task.seq, std::memory_order_seq_cst);
  if (host_waiters_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    done_cv_.notify_all();
  }
}

void Stream::executor_loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (queue_.empty()) {
        // Spin briefly before sleeping: a host issuing a burst of small
        // operators then avoids paying a wake-up per task.
        const uint64_t seen = enqueued_.load(std::memory_order_acquire);
        lock.unlock();
        for (int64_t t0 = now_ns(); enqueued_.load(std::memory_order_acquire) == seen &&
                                    now_ns() - t0 < kSpinNs;)
          std::this_thread::yield();
        lock.lock();
        executor_sleeping_ = true;
        work_cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
        executor_sleeping_ = false;
        if (queue_.empty()) return;  // stopping
      }
      // A task that lingers (Task::linger_ns) waits while the host amends it,
      // until something else is queued, a host waits, or time is up.
      while (queue_.size() == 1 && queue_.front().linger_ns > 0 && host_waiters_ == 0 && !stopping_) {
        const int64_t left = queue_.front().amended_ns + queue_.front().linger_ns - now_ns();
        if (left <= 0) break;
        executor_sleeping_ = true;
        work_cv_.wait_for(lock, std::chrono::nanoseconds(left));
        executor_sleeping_ = false;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    run_one(task);
  }
}

void Stream::wait_until(uint64_t seq) {
  if (is_complete(seq)) return;
  std::unique_lock<std::mutex> lock(mu_);
  ++host_waiters_;
  if (executor_sleeping_) work_cv_.notify_one();  // a lingering task starts now
  done_cv_.wait(lock, [&] { return completed_.load(std::memory_order_seq_cst) >= seq; });
  --host_waiters_;
}

void Stream::synchronize() {
  wait_until(last_enqueued());
  device_.raise_pending_error();
}

bool Stream::amend_pending_tail(const std::function<bool(Task&)>& amend) {
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.empty() || !amend(queue_.back())) return false;
  queue_.back().amended_ns = now_ns();
  return true;
}

size_t Stream::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

} // namespace torchneuron::runtime
