#include "stream.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>

#include "device.h"
#include "errors.h"
#include "memcheck.h"

namespace torchneuron::runtime {

namespace {
constexpr int64_t kSpinNs = 50'000;
std::atomic<WaitInterruptCheck> g_wait_interrupt_check{nullptr};

// Who may touch a slot's task.
enum SlotState : uint32_t {
  kFree,      // nobody: the slot waits for a host to fill it
  kReady,     // queued: the executor may claim it, a host may amend it
  kAmending,  // a host is changing it; the executor waits
  kTaken,     // the executor runs it, then frees the slot
};
} // namespace

thread_local uint64_t t_launch_tag = 0;
void set_launch_tag(uint64_t tag) { t_launch_tag = tag; }
uint64_t launch_tag() { return t_launch_tag; }

namespace {
Launcher this_launcher() {
  thread_local const int32_t thread = static_cast<int32_t>(::syscall(SYS_gettid));
  return Launcher{t_launch_tag, thread};
}
} // namespace

void set_wait_interrupt_check(WaitInterruptCheck check) { g_wait_interrupt_check.store(check); }
WaitInterruptCheck wait_interrupt_check() { return g_wait_interrupt_check.load(std::memory_order_acquire); }

struct alignas(64) Stream::Slot {
  std::atomic<uint32_t> state{kFree};
  // Host time until which an idle executor holds a lingering task back (0:
  // no lingering): its launch or last amendment plus OpenWork::linger_ns. Kept
  // here, atomic, because the executor reads it while a host may amend.
  std::atomic<int64_t> linger_until{0};
  Task task;
};

struct Stream::Segment {
  static constexpr uint32_t kSlots = 64;
  Slot slots[kSlots];
  std::atomic<Segment*> next{nullptr};
};

Stream::Stream(Device& device, int id) : device_(device), id_(id) { head_ = tail_ = new Segment(); }

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> lock(sleep_mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (executor_.joinable()) executor_.join();  // it drains the queue first
  for (Segment* s = head_; s;) delete std::exchange(s, s->next.load());
  delete spare_.load();
}

uint64_t Stream::enqueue(TaskName name, TaskBody run) {
  Task task;
  task.name = std::move(name);
  task.run = std::move(run);
  return enqueue(std::move(task));
}

uint64_t Stream::enqueue(Task task) {
  const uint64_t seq = push(std::move(task), true);
  if (device_.launch_blocking()) {
    // Debug mode: the launch returns once the task ran, and raises its error.
    wait_until(seq);
    device_.raise_pending_error();
  }
  return seq;
}

uint64_t Stream::enqueue_external(TaskName name, TaskBody run, std::shared_ptr<ExternalEnd> end) {
  ExternalEnd& e = *end;
  e.stream_ = this;
  e.name_ = name.str();
  e.executor_completes_ = device_.observed() || memcheck::on();
  const bool host_may_reach = !run && !e.executor_completes_;
  Task task;
  task.name = std::move(name);
  task.run = std::move(run);
  task.end = std::move(end);
  // The executor's wake-up is what the external end saves: skipped when the
  // host can reach the task itself, which it may once every earlier task is
  // done (completed_ moves only through this task now). The executor passes
  // such slots when later work wakes it, or every kHostReachedRun of them, so
  // that they do not pile up.
  constexpr uint64_t kHostReachedRun = 32;
  const uint64_t seq = push(std::move(task), !host_may_reach);
  const bool reached = host_may_reach && completed_.load(std::memory_order_seq_cst) + 1 == seq;
  if (reached && e.reach()) on_external_finished(e);
  if (host_may_reach && (!reached || seq % kHostReachedRun == 0)) wake_executor();
  if (device_.launch_blocking()) {
    wait_until(seq);
    device_.raise_pending_error();
  }
  return seq;
}

uint64_t Stream::push(Task task, bool wake) {
  task.enqueued_ns = now_ns();
  if (device_.observed()) task.launcher = this_launcher();
  const int64_t linger = task.open ? task.open->linger_ns() : 0;
  const int64_t linger_until = linger > 0 ? task.enqueued_ns + linger : 0;
  if (task.open) open_waiting_.fetch_add(1, std::memory_order_relaxed);
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(producer_mu_);
    if (tail_pos_ == Segment::kSlots) {
      Segment* fresh = spare_.exchange(nullptr, std::memory_order_acquire);
      if (!fresh) fresh = new Segment();
      tail_->next.store(fresh, std::memory_order_release);
      tail_ = fresh;
      tail_pos_ = 0;
    }
    Slot& slot = tail_->slots[tail_pos_++];
    seq = task.seq = enqueued_.load(std::memory_order_relaxed) + 1;
    if (task.end) task.end->seq_ = seq;
    slot.task = std::move(task);
    slot.linger_until.store(linger_until, std::memory_order_relaxed);
    slot.state.store(kReady, std::memory_order_release);
    newest_ = &slot;
    // Sequentially consistent, as the executor going to sleep is: either it
    // sees this task, or this thread sees it asleep below.
    enqueued_.store(seq, std::memory_order_seq_cst);
    if (!executor_.joinable()) executor_ = std::thread([this] { executor_loop(); });
  }
  if (wake) wake_executor();
  return seq;
}

void Stream::wake_executor() {
  if (executor_sleeping_.load(std::memory_order_seq_cst)) {
    std::lock_guard<std::mutex> lock(sleep_mu_);
    work_cv_.notify_one();
  }
}

void Stream::run_one(Task& task) {
  task.started_ns = now_ns();
  device_.busy_time().task_started(task.started_ns);
  const bool cancelled = task.seq <= cancelled_through_.load(std::memory_order_acquire);
  const bool checked = memcheck::on() && !cancelled;
  if (checked) memcheck::task_hook(device_.index(), id_, task, false);
  bool failed = false;
  try {
    if (!cancelled && task.run) task.run();
  } catch (...) {
    record_failure(task.name.str(), std::current_exception());
    failed = true;
  }
  // An external task whose body failed, or was cancelled, never started its work.
  const bool completes = !task.end || await_end(*task.end, cancelled || failed);
  task.finished_ns = task.end ? task.end->finished_ns_ : now_ns();
  if (checked) memcheck::task_hook(device_.index(), id_, task, true);
  device_.busy_time().task_finished(std::max(task.finished_ns, task.started_ns));
  if (!cancelled) device_.observe(id_, task);
  task.run = nullptr;  // release captures before the task counts as done
  task.open.reset();
  const std::shared_ptr<ExternalEnd> end = std::move(task.end);
  if (!completes) return;
  complete(task.seq);
  if (end) end->completed();
}

void Stream::complete(uint64_t seq) {
  // Without the lock unless a host waits for this task or an earlier one: a
  // waiter lowers wake_at_ (under the lock) before it reads completed_, and
  // both sides' accesses are sequentially consistent, so either this sees its
  // task or the waiter sees this store. Woken hosts still waiting for a later
  // task lower wake_at_ again before they sleep.
  completed_.store(seq, std::memory_order_seq_cst);
  if (seq >= wake_at_.load(std::memory_order_seq_cst)) {
    std::lock_guard<std::mutex> lock(sleep_mu_);
    wake_at_.store(kNobodyWaits, std::memory_order_seq_cst);
    done_cv_.notify_all();
  }
}

void Stream::record_failure(const std::string& task, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    device_.record_error(AsyncError(device_.index(), id_, task, e.what(), error));
  } catch (...) {
    device_.record_error(AsyncError(device_.index(), id_, task, "unknown exception", error));
  }
}

bool ExternalEnd::reach() {
  const uint32_t before = state_.fetch_or(kReached, std::memory_order_acq_rel);
  return (before & kFinished) && !(before & kReached);
}

void ExternalEnd::finish(std::exception_ptr error) {
  if (called_.exchange(true, std::memory_order_acq_rel)) return;
  error_ = std::move(error);
  finished_ns_ = now_ns();
  if (state_.fetch_or(kFinished, std::memory_order_acq_rel) & kReached) stream_->on_external_finished(*this);
}

void ExternalEnd::then(std::shared_ptr<ExternalEnd> next) {
  {
    std::lock_guard<std::mutex> lock(then_mu_);
    if (!completed_) {
      next_.push_back(std::move(next));
      return;
    }
  }
  finish_follower(*next);
}

void ExternalEnd::completed() {
  std::vector<std::shared_ptr<ExternalEnd>> next;
  {
    std::lock_guard<std::mutex> lock(then_mu_);
    completed_ = true;
    next.swap(next_);
  }
  for (auto& n : next) finish_follower(*n);  // a failure is the device's error already
}

void ExternalEnd::finish_follower(ExternalEnd& next) const {
  // The memory checker learns the order before the follower can end (its
  // stream's later tasks run only then). Orders between devices are not followed.
  if (memcheck::on() && next.stream_ && next.stream_->device_.index() == stream_->device_.index())
    memcheck::follow_hook(stream_->device_.index(), next.stream_->id_, next.seq_, stream_->id_, seq_);
  next.finish();
}

// On the thread that made the task's end the second of the two events.
void Stream::on_external_finished(ExternalEnd& e) {
  if (!e.executor_completes_) {
    if (e.error_) record_failure(e.name_, e.error_);
    complete(e.seq_);
    e.completed();
  }
  if (awaiting_end_.load(std::memory_order_seq_cst)) {
    std::lock_guard<std::mutex> lock(sleep_mu_);
    work_cv_.notify_all();
  }
}

bool Stream::await_end(ExternalEnd& e, bool give_up) {
  if (give_up) e.finish();
  const bool completes = e.reach() || e.executor_completes_;
  auto ended = [&] {
    return completes ? (e.state_.load(std::memory_order_acquire) & ExternalEnd::kFinished) != 0
                     : completed_.load(std::memory_order_seq_cst) >= e.seq_;
  };
  while (!ended()) {
    std::unique_lock<std::mutex> lock(sleep_mu_);
    awaiting_end_.store(true, std::memory_order_seq_cst);
    work_cv_.wait(lock, [&] { return ended() || stopping_; });
    awaiting_end_.store(false, std::memory_order_relaxed);
    if (ended()) break;
    lock.unlock();
    e.finish();  // the stream is being destroyed: its executor stops waiting
  }
  if (completes && e.error_) record_failure(e.name_, e.error_);
  return completes;
}

void Stream::executor_loop() {
  memcheck::grant_thread();  // the device's own thread
  while (Slot* slot = next_task()) {
    run_one(slot->task);
    slot->task = Task();
    slot->state.store(kFree, std::memory_order_relaxed);
  }
}

Stream::Slot* Stream::head_slot() {
  if (head_pos_ == Segment::kSlots) {
    Segment* next = head_->next.load(std::memory_order_acquire);
    if (!next) return nullptr;
    // Every slot of the old segment has run, and the newest task is in a
    // later one: hosts may refill it.
    Segment* done = std::exchange(head_, next);
    head_pos_ = 0;
    done->next.store(nullptr, std::memory_order_relaxed);
    delete spare_.exchange(done, std::memory_order_acq_rel);
  }
  return &head_->slots[head_pos_];
}

Stream::Slot* Stream::next_task() {
  for (;;) {
    Slot* slot = head_slot();
    uint32_t state = slot ? slot->state.load(std::memory_order_acquire) : kFree;
    if (state == kFree) {
      if (!idle()) return nullptr;
      continue;
    }
    if (state == kAmending) {
      std::this_thread::yield();
      continue;
    }
    // A task that lingers (OpenWork::linger_ns) waits while the host amends it,
    // until something else is queued, a host waits, or time is up.
    if (const int64_t until = slot->linger_until.load(std::memory_order_relaxed)) {
      const uint64_t seq = slot->task.seq;  // never amended
      auto go = [&] { return stopping_ || host_waiters_.load() > 0 || enqueued_.load() != seq; };
      if (until > now_ns() && !go()) {
        std::unique_lock<std::mutex> lock(sleep_mu_);
        executor_sleeping_.store(true, std::memory_order_seq_cst);
        work_cv_.wait_for(lock, std::chrono::nanoseconds(until - now_ns()), go);
        executor_sleeping_.store(false, std::memory_order_relaxed);
        continue;  // look again: it may have been amended, with a later deadline
      }
    }
    if (slot->state.compare_exchange_strong(state, kTaken, std::memory_order_acquire)) {
      ++head_pos_;
      started_.store(slot->task.seq, std::memory_order_relaxed);
      if (slot->task.open) open_waiting_.fetch_sub(1, std::memory_order_relaxed);
      return slot;
    }
  }
}

bool Stream::idle() {
  // Spin briefly before sleeping: a host issuing a burst of small operators
  // then avoids paying a wake-up per task.
  const uint64_t seen = started_.load(std::memory_order_relaxed);
  auto work = [&] { return enqueued_.load(std::memory_order_seq_cst) != seen; };
  for (int64_t t0 = now_ns(); !work() && now_ns() - t0 < kSpinNs;) std::this_thread::yield();
  std::unique_lock<std::mutex> lock(sleep_mu_);
  executor_sleeping_.store(true, std::memory_order_seq_cst);
  work_cv_.wait(lock, [&] { return work() || stopping_; });
  executor_sleeping_.store(false, std::memory_order_relaxed);
  return work();  // when stopping, after the last task
}

bool Stream::wait_until(uint64_t seq, int64_t deadline_ns) {
  struct Waited {  // tells the memory checker of the order a finished wait makes
    const Stream& s;
    uint64_t seq;
    ~Waited() {
      if (memcheck::on() && s.is_complete(seq)) memcheck::wait_hook(s.device_.index(), s.id_, seq);
    }
  } waited{*this, seq};
  if (is_complete(seq)) return true;
  // How often a waiting host looks for an interrupt (Ctrl-C).
  constexpr auto kInterruptPoll = std::chrono::milliseconds(50);
  const WaitInterruptCheck check = wait_interrupt_check();
  auto done = [&] { return completed_.load(std::memory_order_seq_cst) >= seq; };
  std::unique_lock<std::mutex> lock(sleep_mu_);
  ++host_waiters_;
  struct Unregister {  // also when the interrupt check throws
    std::atomic<int>& waiters;
    ~Unregister() { --waiters; }
  } unregister{host_waiters_};
  // A lingering task (an open one) starts now. Only such a task sleeps with
  // work queued but for the slots the host reached, which need no executor.
  if (executor_sleeping_ && open_waiting_.load(std::memory_order_relaxed) > 0) work_cv_.notify_one();
  // True once `seq` is done; else asks to be woken when it is (see complete()).
  auto done_or_ask = [&] {
    if (wake_at_.load(std::memory_order_relaxed) > seq) wake_at_.store(seq, std::memory_order_seq_cst);
    return done();
  };
  if (!check && deadline_ns == kNoDeadline) {
    done_cv_.wait(lock, done_or_ask);
    return true;
  }
  while (!done_or_ask()) {
    const int64_t now = now_ns();
    if (now >= deadline_ns) return false;
    auto slice = std::min<std::chrono::nanoseconds>(kInterruptPoll, std::chrono::nanoseconds(deadline_ns - now));
    if (done_cv_.wait_for(lock, slice, done_or_ask)) break;
    if (check) {
      lock.unlock();  // the check may take the interpreter's lock: never under ours
      check();
      lock.lock();
    }
  }
  return true;
}

void Stream::synchronize() {
  wait_until(last_enqueued());
  device_.raise_pending_error();
}

bool Stream::amend_pending_tail(const std::function<bool(Task&)>& amend) {
  std::lock_guard<std::mutex> lock(producer_mu_);
  Slot* slot = newest_;
  uint32_t ready = kReady;
  if (!slot || !slot->state.compare_exchange_strong(ready, kAmending, std::memory_order_acquire)) return false;
  struct Release {  // hands the task back to the executor, even if `amend` throws
    Slot* slot;
    ~Release() { slot->state.store(kReady, std::memory_order_release); }
  } release{slot};
  if (!amend(slot->task)) return false;
  if (const int64_t linger = slot->task.open ? slot->task.open->linger_ns() : 0; linger > 0)
    slot->linger_until.store(now_ns() + linger, std::memory_order_relaxed);
  return true;
}

void Stream::notify_free(const void* ptr, size_t nbytes) {
  if (open_waiting_.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(producer_mu_);
  Slot* slot = newest_;
  uint32_t ready = kReady;
  if (!slot || !slot->state.compare_exchange_strong(ready, kAmending, std::memory_order_acquire)) return;
  struct Release {  // hands the task back to the executor, even if `on_free` throws
    Slot* slot;
    ~Release() { slot->state.store(kReady, std::memory_order_release); }
  } release{slot};
  if (slot->task.open) slot->task.open->on_free(ptr, nbytes);
}

void Stream::cancel_pending() {
  uint64_t through = enqueued_.load(std::memory_order_acquire);
  uint64_t seen = cancelled_through_.load(std::memory_order_relaxed);
  while (seen < through && !cancelled_through_.compare_exchange_weak(seen, through, std::memory_order_acq_rel)) {
  }
}

size_t Stream::pending() const {
  // The executor may claim a task a moment before its host counts it.
  const uint64_t started = started_.load(std::memory_order_acquire);
  const uint64_t enqueued = enqueued_.load(std::memory_order_acquire);
  return enqueued > started ? enqueued - started : 0;
}

} // namespace torchneuron::runtime
