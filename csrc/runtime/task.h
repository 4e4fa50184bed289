// A unit of device work. Streams run tasks in order; each carries a name (the
// operator it executes, for errors and the profiler) and device-side timestamps.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace torchneuron::runtime {

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A task's name: the operator it executes, for errors and the profiler. A
// name that outlives the task (an operator's, which the bridge keeps for the
// life of the process) is borrowed, so a launch copies nothing; any other
// name is owned.
class TaskName {
 public:
  TaskName() = default;
  TaskName(std::string name) : owned_(std::move(name)) {}
  TaskName(const char* name) : owned_(name) {}
  static TaskName borrow(const std::string& lasting) {
    TaskName n;
    n.borrowed_ = &lasting;
    return n;
  }

  const std::string& str() const { return borrowed_ ? *borrowed_ : owned_; }
  TaskName& operator+=(std::string_view more) {
    if (borrowed_) owned_ = *std::exchange(borrowed_, nullptr);
    owned_ += more;
    return *this;
  }

 private:
  std::string owned_;
  const std::string* borrowed_ = nullptr;
};

// A task's work: a move-only callable, kept inline when its captures fit (the
// bridge's closures do), so that a launch allocates nothing for the executor
// thread to free. glibc serves such cross-thread pairs through its locked
// arena, at hundreds of instructions a block on both threads.
class TaskBody {
 public:
  TaskBody() = default;
  TaskBody(std::nullptr_t) {}
  template <class F, class Fn = std::decay_t<F>,
            class = std::enable_if_t<!std::is_same_v<Fn, TaskBody> && std::is_invocable_v<Fn&>>>
  TaskBody(F&& f) {
    if constexpr (kInline<Fn>) {
      new (storage_) Fn(std::forward<F>(f));
    } else {
      *reinterpret_cast<Fn**>(storage_) = new Fn(std::forward<F>(f));
    }
    ops_ = &kOps<Fn>;
  }
  TaskBody(TaskBody&& o) noexcept { take(o); }
  TaskBody& operator=(TaskBody&& o) noexcept {
    if (this != &o) {
      reset();
      take(o);
    }
    return *this;
  }
  TaskBody& operator=(std::nullptr_t) {
    reset();
    return *this;
  }
  ~TaskBody() { reset(); }

  explicit operator bool() const { return ops_ != nullptr; }
  void operator()() { ops_->call(storage_); }

 private:
  static constexpr size_t kInlineBytes = 64;
  template <class Fn>
  static constexpr bool kInline = sizeof(Fn) <= kInlineBytes && alignof(Fn) <= alignof(std::max_align_t) &&
                                  std::is_nothrow_move_constructible_v<Fn>;

  struct Ops {
    void (*call)(void* storage);
    void (*move)(void* to, void* from);  // and destroys `from`
    void (*destroy)(void* storage);
  };
  template <class Fn>
  static Fn& target(void* storage) {
    if constexpr (kInline<Fn>) return *static_cast<Fn*>(storage);
    else return **static_cast<Fn**>(storage);
  }
  template <class Fn>
  static constexpr Ops kOps = {
      [](void* s) { target<Fn>(s)(); },
      [](void* to, void* from) {
        if constexpr (kInline<Fn>) {
          new (to) Fn(std::move(target<Fn>(from)));
          target<Fn>(from).~Fn();
        } else {
          *static_cast<Fn**>(to) = *static_cast<Fn**>(from);
        }
      },
      [](void* s) {
        if constexpr (kInline<Fn>) target<Fn>(s).~Fn();
        else delete *static_cast<Fn**>(s);
      }};

  void take(TaskBody& o) {
    if (!o.ops_) return;
    o.ops_->move(storage_, o.storage_);
    ops_ = std::exchange(o.ops_, nullptr);
  }
  void reset() {
    // The captures' destructors may launch work of their own: clear first.
    if (const Ops* ops = std::exchange(ops_, nullptr)) ops->destroy(storage_);
  }

  alignas(std::max_align_t) unsigned char storage_[kInlineBytes];
  const Ops* ops_ = nullptr;
};

// Work that stays open while its task waits in the queue. A client merges
// later launches into it (Stream::amend_pending_tail) and hears when device
// memory is freed on the stream behind it (Stream::notify_free), so that a
// temporary nobody holds need never be written. The bridge's fuser is the
// client; the runtime knows only this interface.
class OpenWork {
 public:
  virtual ~OpenWork() = default;
  // Device memory [ptr, ptr + nbytes) lost its last owner on this task's
  // stream while the task is the newest one and has not started.
  virtual void on_free(const void* ptr, size_t nbytes) = 0;
  // How long an idle executor holds the task back after its launch and after
  // each amendment, while it is the stream's only task and no host waits:
  // work still being issued can then join it instead of following it.
  virtual int64_t linger_ns() const { return 0; }
};

// Who launched a task, for a profiler: the launching thread's tag (the
// profiler's id of the operator it is running) and its system thread id.
// Taken at enqueue only while a task observer is set.
struct Launcher {
  uint64_t tag = 0;
  int32_t thread = 0;
};

class ExternalEnd;  // stream.h

struct Task {
  TaskName name;
  TaskBody run;
  uint64_t seq = 0;          // 1-based position in its stream, set on enqueue
  int64_t enqueued_ns = 0;   // host time of the launch
  int64_t started_ns = 0;    // device time the task began
  int64_t finished_ns = 0;   // device time the task ended
  Launcher launcher;         // set on enqueue while observed
  std::shared_ptr<OpenWork> open;  // null for work that cannot change once queued
  std::shared_ptr<ExternalEnd> end;  // null: the task ends when `run` returns
};

// Called on the executor thread after every task (profiler feed). Must be cheap.
using TaskObserver = void (*)(int device, int stream, const Task& task);

// The calling thread's launch tag, recorded in the tasks it enqueues while a
// task observer is set (a profiler sets it to the operator being run).
void set_launch_tag(uint64_t tag);
uint64_t launch_tag();

} // namespace torchneuron::runtime
