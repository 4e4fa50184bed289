// The device memory checker's bridge half (memcheck.h).
#include "memcheck.h"

#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "../device_state.h"

namespace torchneuron::memcheck {
namespace {

constexpr unsigned char kPoison = 0xFB;
// A handed-out block is checked whole up to twice this, else its first and
// last kCheckSpan bytes: the fill is always whole, the check is bounded.
constexpr size_t kCheckSpan = 32 << 10;
constexpr size_t kCanaryMax = 4096;  // of the slack after the requested bytes

constexpr int kStreams = rt::Device::kStreams;

// A point in one stream's order. Task `seq` is at 2 * seq; work the host did
// on the stream's behalf while the stream was idle after task `seq` (a
// synchronous first call, FirstCall) is at 2 * seq + 1: after that task,
// before the next one. 0: none.
using Position = uint64_t;
constexpr Position at_task(uint64_t seq) { return 2 * seq; }
constexpr Position after_task(uint64_t seq) { return 2 * seq + 1; }

// A task on another stream than a block's that used the block (queued before
// it was freed, or a first call while it lived) without record_stream for
// that stream: the memory's next owner on the block's stream must be
// ordered after it.
struct OtherUse {
  int stream;
  Position at;
  std::string op;
  bool first_call = false;  // a synchronous first call, not a task (FirstCall)
};

struct Live {
  int device = 0, stream = 0;
  size_t size = 0, requested = 0;
  uint64_t id = 0;
  int64_t alloc_ns = 0;
  bool armed = false;  // its redzone holds the canary
  std::vector<int> recorded;
  std::string tensor;  // what it was allocated for, when a tensor factory said
  HistoryContext alloc;
  std::vector<OtherUse> other_uses;  // of the memory's previous owners, queued before they were freed
  // This owner's uses by first calls on other streams: they ran before any
  // free, and their signatures' later calls queue (FirstCall).
  std::vector<OtherUse> first_calls_elsewhere;
  Position first_use = 0;  // the new owner's first use on its stream (0: none yet)
  // The freed blocks this one's memory came from: (address, size, free stack).
  std::vector<std::tuple<uintptr_t, size_t, HistoryContext>> previous;
};
struct Freed {
  int device = 0, stream = 0;
  size_t size = 0, requested = 0;
  int64_t free_ns = 0;
  std::vector<int> recorded;
  std::string tensor;
  HistoryContext alloc, free;
  std::vector<OtherUse> other_uses;
};

std::mutex table_mu;
std::map<uintptr_t, Live> live;
std::map<uintptr_t, Freed> freed;
uint64_t next_id = 0;
std::set<std::pair<uintptr_t, int>> reported_cross;  // (block id, stream) already reported

// The orders between a device's streams, as vector clocks, under table_mu.
// A stream's clock at a position holds, for every stream of the device, the
// latest position of that stream ordered before it, directly or through any
// chain of finished waits (runtime::memcheck::wait_hook):
//   * an event wait an executor ran in task u of stream W for task q of P,
//     or task u of W that P's task q ended once done (a stream's wait for a
//     collective, runtime::memcheck::follow_hook): W's positions after u get
//     P's clock at q, and P's q itself;
//   * a host wait for task q of P: the host's clock gets P's clock at q (and
//     q, or the host work after q if the stream did some since), and every
//     stream's positions after its newest queued task get the host's clock
//     (what the host queues from now on follows all it waited for).
// A clock is final for a position once that position's task could run:
// the waits before it on its own stream ran, and host orders are added
// ahead of the tasks they cover.
using Clock = std::array<Position, kStreams>;
struct ClockFrom {
  Position from;  // the clock holds from this position to the next entry's
  Clock clock;
};
struct StreamOrder {
  std::vector<ClockFrom> history;  // ascending `from`, each clock covering the ones before
  Position host_work = 0;          // the newest host work on the stream (FirstCall)
};
// Entries kept per stream: older ones are dropped, the oldest kept standing
// for them, so a question about a long past position may take a later clock
// (a missed report, never a false one).
constexpr size_t kHistoryKept = 4096;
std::map<std::pair<int, int>, StreamOrder> stream_orders;  // (device, stream)
std::map<int, Clock> host_clocks;                          // device -> what its host waited for

// The clock in force at `at` on a stream; null when nothing orders it.
const Clock* clock_at(int device, int stream, Position at) {
  auto s = stream_orders.find({device, stream});
  if (s == stream_orders.end()) return nullptr;
  const auto& h = s->second.history;
  auto it = std::upper_bound(h.begin(), h.end(), at, [](Position a, const ClockFrom& c) { return a < c.from; });
  return it == h.begin() ? nullptr : &std::prev(it)->clock;
}

// Everything ordered before position `at` of `stream`, and `at` itself.
Clock known_at(int device, int stream, Position at) {
  const Clock* c = clock_at(device, stream, at);
  Clock known = c ? *c : Clock{};
  known[stream] = std::max(known[stream], at);
  return known;
}

bool covers(const Clock& a, const Clock& b) {
  for (int s = 0; s < kStreams; ++s)
    if (a[s] < b[s]) return false;
  return true;
}

void merge_into(Clock& into, const Clock& from) {
  for (int s = 0; s < kStreams; ++s) into[s] = std::max(into[s], from[s]);
}

// Positions of `stream` from `from` on are ordered after everything `known` holds.
void order_after(int device, int stream, Position from, Clock known) {
  known[stream] = 0;  // a stream's own order is its positions
  auto& h = stream_orders[{device, stream}].history;
  auto it = std::upper_bound(h.begin(), h.end(), from, [](Position a, const ClockFrom& c) { return a < c.from; });
  if (it == h.begin() || std::prev(it)->from != from) {
    const Clock base = it == h.begin() ? Clock{} : std::prev(it)->clock;
    if (covers(base, known)) return;  // implied, here and after (later clocks cover earlier ones)
    it = h.insert(it, {from, base});
  } else {
    --it;
  }
  for (; it != h.end(); ++it) merge_into(it->clock, known);
  if (h.size() > kHistoryKept) {
    const size_t dropped = h.size() - kHistoryKept / 2;
    h[dropped].from = h.front().from;
    h.erase(h.begin(), h.begin() + dropped);
  }
}

// Whether position `at` of `stream` is ordered after position `other_at` of `other`.
bool follows(int device, int stream, Position at, int other, Position other_at) {
  const Clock* c = clock_at(device, stream, at);
  return c && (*c)[other] >= other_at;
}

struct Request {
  enum Kind { Poison, Check, Arm } kind;
  uint64_t after;  // runs once the stream finished this task, before the next one starts
  char* p;
  size_t n;
  uint64_t id = 0;               // Check, Arm: the block
  std::vector<std::pair<uintptr_t, Freed>> previous;  // Check: the memory's previous owners
  // Poison: and once these other streams finished these tasks, the ones queued
  // when the block was freed: any of them may still read it (a block freed
  // without record_stream for them, its stream waiting for theirs before it
  // reuses the memory, as FSDP2 does, is correct).
  std::vector<std::pair<int, uint64_t>> others;
};
struct Queue {
  std::mutex mu;
  std::vector<Request> requests;
};
std::array<Queue, rt::kMaxDevices * kStreams> queues;
std::array<std::atomic<int>, rt::kMaxDevices> pending_requests{};  // per device
Queue& queue(int device, int stream) { return queues.at(device * kStreams + stream); }

std::atomic<GatherContextFn> gather_fn{nullptr};
HistoryContext gather() {
  GatherContextFn f = gather_fn.load(std::memory_order_relaxed);
  return f ? f() : nullptr;
}

std::mutex reports_mu;
std::vector<Report> reports;
std::atomic<void (*)()> notifier{nullptr};
std::atomic<size_t> n_poisoned{0}, n_checked{0}, n_unchecked{0}, n_canary{0}, n_reports{0};

void report(Report r) {
  {
    std::lock_guard<std::mutex> lock(reports_mu);
    reports.push_back(std::move(r));
  }
  ++n_reports;
  if (auto notify = notifier.load()) notify();
}

std::string hex(uintptr_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%lx", static_cast<unsigned long>(v));
  return buf;
}

std::string where(int device, int stream) {
  return "neuron:" + std::to_string(device) + " stream " + std::to_string(stream);
}

std::string describe(uintptr_t p, const Live& b) {
  return "the block at " + hex(p) + " (" + (b.tensor.empty() ? "" : b.tensor + ", ") +
         std::to_string(b.requested) + " bytes requested, " +
         std::to_string(b.size) + " reserved, allocated on " + where(b.device, b.stream) + ")";
}

std::string describe(uintptr_t p, const Freed& b) {
  return "a block of " + std::to_string(b.requested) + " bytes at " + hex(p) + " (" +
         (b.tensor.empty() ? "" : b.tensor + ", ") + "allocated on " + where(b.device, b.stream) + ")";
}

template <class Map>
auto containing(Map& m, uintptr_t a) {
  auto it = m.upper_bound(a);
  if (it == m.begin()) return m.end();
  --it;
  return a < it->first + it->second.size ? it : m.end();
}

// The first byte of [p, p + n) that is not the poison, checking whole or
// bounded (kCheckSpan); n when there is none.
size_t first_unpoisoned(const char* p, size_t n, bool bounded) {
  auto scan = [&](size_t from, size_t to) {
    for (size_t i = from; i < to; ++i)
      if (static_cast<unsigned char>(p[i]) != kPoison) return i;
    return n;
  };
  if (!bounded || n <= 2 * kCheckSpan) return scan(0, n);
  if (size_t i = scan(0, kCheckSpan); i != n) return i;
  return scan(n - kCheckSpan, n);
}

void run_check(const Request& r) {
  ++n_checked;
  const size_t bad = first_unpoisoned(r.p, r.n, true);
  {
    std::lock_guard<std::mutex> lock(table_mu);
    if (auto it = live.find(reinterpret_cast<uintptr_t>(r.p)); it != live.end() && it->second.id == r.id)
      it->second.armed = true;  // the redzone is poison, hence the canary
  }
  if (bad == r.n) return;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(r.p) + bad;
  Report rep{"write after free", "", {}, false};
  char val[8];
  std::snprintf(val, sizeof val, "0x%02x", static_cast<unsigned char>(r.p[bad]));
  rep.message = "device memory was written after it was freed: byte " + hex(addr) + " holds " + val +
                " instead of the poison 0xfb when the memory was handed out again (" + std::to_string(r.n) +
                " bytes at " + hex(reinterpret_cast<uintptr_t>(r.p)) + ")";
  for (const auto& [p, f] : r.previous)
    if (addr >= p && addr < p + f.size) {
      rep.message += "; it belonged to " + describe(p, f);
      rep.stacks.push_back({"That block was allocated at", f.alloc});
      rep.stacks.push_back({"and freed at", f.free});
    }
  report(std::move(rep));
}

void run(Request& r) {
  switch (r.kind) {
    case Request::Poison:
      std::memset(r.p, kPoison, r.n);
      ++n_poisoned;
      break;
    case Request::Check:
      run_check(r);
      break;
    case Request::Arm: {
      // Only while the block lives: freed and handed out again meanwhile,
      // its redzone may be the new owner's data.
      std::lock_guard<std::mutex> lock(table_mu);
      auto it = containing(live, reinterpret_cast<uintptr_t>(r.p) - 1);
      if (it != live.end() && it->second.id == r.id) {
        std::memset(r.p, kPoison, r.n);
        it->second.armed = true;
      }
      break;
    }
  }
}

// Runs the queue's requests that may run now (call with q.mu held): those
// after tasks before `before`, or all whose task the stream completed.
void run_ready(Queue& q, int device, uint64_t before, const rt::Stream* stream) {
  auto& rs = q.requests;
  size_t kept = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    Request& r = rs[i];
    bool ready = stream ? stream->is_complete(r.after) : r.after < before;
    for (const auto& [s, seq] : r.others) ready = ready && rt::device(device).stream(s).is_complete(seq);
    if (ready) {
      run(r);
      pending_requests[device].fetch_sub(1, std::memory_order_relaxed);
    } else if (kept != i) {
      rs[kept++] = std::move(r);
    } else {
      ++kept;
    }
  }
  rs.resize(kept);
}

void push(int device, int stream, Request r) {
  Queue& q = queue(device, stream);
  runtime::memcheck::DeviceAccess access;
  std::lock_guard<std::mutex> lock(q.mu);
  q.requests.push_back(std::move(r));
  pending_requests[device].fetch_add(1, std::memory_order_relaxed);
  run_ready(q, device, 0, &rt::device(device).stream(stream));
}

bool overlaps(uintptr_t a, size_t an, uintptr_t b, size_t bn) { return a < b + bn && b < a + an; }

// Pending poison fills over [p, p + n) of one stream are dropped (the memory
// is in use again before they ran); whether there were any.
bool cancel_poison(Queue& q, int device, char* p, size_t n) {
  bool any = false;
  std::vector<Request> pieces;
  auto& rs = q.requests;
  for (auto it = rs.begin(); it != rs.end();) {
    if (it->kind != Request::Poison || !overlaps(uintptr_t(it->p), it->n, uintptr_t(p), n)) {
      ++it;
      continue;
    }
    any = true;
    auto piece = [&](char* from, char* to) {
      Request r{Request::Poison, it->after, from, size_t(to - from)};
      r.others = it->others;
      pieces.push_back(std::move(r));
    };
    if (it->p < p) piece(it->p, p);
    if (it->p + it->n > p + n) piece(p + n, it->p + it->n);
    it = rs.erase(it);
    pending_requests[device].fetch_sub(1, std::memory_order_relaxed);
  }
  for (auto& piece : pieces) {
    rs.push_back(std::move(piece));
    pending_requests[device].fetch_add(1, std::memory_order_relaxed);
  }
  return any;
}

// The task an executor thread runs, and the device memory it viewed.
struct CurrentTask {
  const rt::Task* task = nullptr;
  int device = 0, stream = 0;
  std::vector<uintptr_t> views;
};
thread_local CurrentTask t_current;

// The synchronous first call a host thread runs (FirstCall), and the device
// memory it viewed.
struct CurrentFirstCall {
  int depth = 0;  // nested scopes: the outermost one counts
  int device = 0, stream = 0;
  uint64_t tail = 0;  // the stream's newest task when the call began
  const std::string* op = nullptr;
  std::vector<uintptr_t> views;
};
thread_local CurrentFirstCall t_first_call;

bool recorded_on(const std::vector<int>& streams, int s) {
  return std::find(streams.begin(), streams.end(), s) != streams.end();
}

// A block handed out again on its stream while another stream's use `u`
// touched its memory: the new owner's first use must follow `u`, or the two
// may run at once on the same memory (call with table_mu held).
void check_reuse(int device, uintptr_t p, const Live& b, const OtherUse& u) {
  if (follows(device, b.stream, b.first_use, u.stream, u.at)) return;
  if (!reported_cross.insert({b.id, u.stream}).second) return;
  Report rep{"missing record_stream", "", {}, false};
  const std::string use = u.first_call ? "the first call of " + u.op + " on " + where(device, u.stream) +
                                             " (its call signature's first call ran on the host; later calls queue)"
                                       : "task " + u.op + " on " + where(device, u.stream);
  rep.message = use + " used device memory that was freed and handed " +
                "out again on " + where(device, b.stream) + ", and nothing orders the new owner's work after that " +
                (u.first_call ? "call" : "task") + ": it is now " + describe(p, b) + ". A tensor used on a stream " +
                "other than the one it was allocated on needs tensor.record_stream(stream) before it is freed, or " +
                "the allocating stream must wait for that stream (wait_stream, wait_event, a synchronisation) " +
                "before its memory is reused";
  for (const auto& [q, n, free] : b.previous) rep.stacks.push_back({"The memory's previous block was freed at", free});
  rep.stacks.push_back({"and handed out again at", b.alloc});
  report(std::move(rep));
}

// The new owner's first use of block `b` on its own stream, at `at`: checked
// against every other stream's use of the memory's previous owners.
void first_use(int device, uintptr_t p, Live& b, Position at) {
  b.first_use = at;
  for (const OtherUse& u : b.other_uses) check_reuse(device, p, b, u);
}

void after_task(const CurrentTask& cur) {
  auto views = cur.views;
  std::sort(views.begin(), views.end());
  views.erase(std::unique(views.begin(), views.end()), views.end());
  const std::string& op = cur.task->name.str();
  std::lock_guard<std::mutex> lock(table_mu);
  for (uintptr_t v : views) {
    if (auto it = containing(live, v); it != live.end()) {
      Live& b = it->second;
      char* p = reinterpret_cast<char*>(it->first);
      if (b.armed && b.size > b.requested) {
        ++n_canary;
        const size_t n = std::min(b.size - b.requested, kCanaryMax);
        const size_t bad = first_unpoisoned(p + b.requested, n, false);
        if (bad != n) {
          Report rep{"out of bounds", "", {{"The block was allocated at", b.alloc}}, false};
          rep.message = "task " + op + " on " + where(cur.device, cur.stream) + " wrote past the end of " +
                        describe(it->first, b) + ": byte " + std::to_string(b.requested + bad) +
                        " of the block (" + std::to_string(bad) + " past the requested bytes) was overwritten";
          std::memset(p + b.requested, kPoison, n);  // re-armed: one report per overrun
          report(std::move(rep));
        }
      }
      if (b.stream == cur.stream) {
        if (b.first_use == 0 && cur.task->enqueued_ns > b.alloc_ns)  // the new owner's first task
          first_use(cur.device, it->first, b, at_task(cur.task->seq));
      } else if (!recorded_on(b.recorded, cur.stream) && b.alloc_ns > cur.task->enqueued_ns) {
        // Queued before the memory was handed out again: it used a previous owner.
        b.other_uses.push_back({cur.stream, at_task(cur.task->seq), op});
        if (b.first_use != 0) check_reuse(cur.device, it->first, b, b.other_uses.back());
      }
    } else if (auto f = containing(freed, v); f != freed.end()) {
      Freed& b = f->second;
      if (b.stream != cur.stream && !recorded_on(b.recorded, cur.stream) && b.free_ns > cur.task->enqueued_ns)
        b.other_uses.push_back({cur.stream, at_task(cur.task->seq), op});
    }
  }
}

void task_hook(int device, int stream, const rt::Task& task, bool finished) {
  try {
    if (!finished) {
      t_current.task = &task;
      t_current.device = device;
      t_current.stream = stream;
      t_current.views.clear();
      if (pending_requests[device].load(std::memory_order_relaxed) > 0) {
        Queue& q = queue(device, stream);
        std::lock_guard<std::mutex> lock(q.mu);
        run_ready(q, device, task.seq, nullptr);
      }
      return;
    }
    if (!t_current.views.empty()) after_task(t_current);
  } catch (...) {
    // A checker's failure (out of host memory) must not fail the task.
  }
  t_current.task = nullptr;
}

void wait_hook(int device, int stream, uint64_t seq) {
  try {
    std::lock_guard<std::mutex> lock(table_mu);
    if (t_current.task) {  // an executor's event wait: its stream's later positions follow
      if (t_current.device == device)  // orders through another device are not followed
        order_after(device, t_current.stream, after_task(t_current.task->seq), known_at(device, stream, at_task(seq)));
      return;
    }
    // A host wait. The stream's host work after `seq`, if it did some since
    // (a first call), is done too: it ran before this wait began.
    const Position host_work = stream_orders[{device, stream}].host_work;
    Clock& host = host_clocks[device];
    merge_into(host, known_at(device, stream, host_work == after_task(seq) ? host_work : at_task(seq)));
    rt::Device& d = rt::device(device);
    for (int s = 0; s < kStreams; ++s)
      if (const rt::Stream* w = d.made_stream(s)) order_after(device, s, after_task(w->last_enqueued()), host);
  } catch (...) {
  }
}

// Task `waiter_seq` of `waiter` ended once task `seq` of `stream` was done,
// on the completing thread (ExternalEnd::then): the waiter's later positions
// follow it, as after an event wait.
void follow_hook(int device, int waiter, uint64_t waiter_seq, int stream, uint64_t seq) {
  try {
    std::lock_guard<std::mutex> lock(table_mu);
    order_after(device, waiter, after_task(waiter_seq), known_at(device, stream, at_task(seq)));
  } catch (...) {
  }
}

// Inside the SIGSEGV handler (runtime/memcheck.h).
void on_fault(const runtime::memcheck::Fault& f) {
  // OpenMP workers of a kernel's parallel region run device work for a
  // thread that holds access; they keep the access the fault granted.
  if (omp_in_parallel() && omp_get_thread_num() > 0) return;
  Report rep{"host access", "", {}, true};
  const auto addr = reinterpret_cast<uintptr_t>(f.addr);
  std::string what = "device memory at " + hex(addr);
  {
    std::lock_guard<std::mutex> lock(table_mu);
    if (auto it = containing(live, addr); it != live.end()) {
      what += ", byte " + std::to_string(addr - it->first) + " of " + describe(it->first, it->second);
      rep.stacks.push_back({"The block was allocated at", it->second.alloc});
    } else if (auto fr = containing(freed, addr); fr != freed.end()) {
      what += ", byte " + std::to_string(addr - fr->first) + " of a freed block: " + describe(fr->first, fr->second);
      rep.stacks.push_back({"The block was allocated at", fr->second.alloc});
      rep.stacks.push_back({"and freed at", fr->second.free});
    } else {
      what += " (free memory of a device segment)";
    }
  }
  Dl_info info{};
  std::string place = hex(reinterpret_cast<uintptr_t>(f.ip));
  if (dladdr(f.ip, &info) && info.dli_fname) {
    place += " in ";
    place += info.dli_sname ? info.dli_sname : "?";
    place += " (";
    place += info.dli_fname;
    place += ")";
  }
  rep.message = std::string("host code ") + (f.write ? "wrote" : "read") + " " + what +
                " outside a device task (thread " + std::to_string(f.thread) + ", instruction " + place +
                "); device memory is only for device work: copy the tensor to the CPU (tensor.cpu()) to read it";
  report(std::move(rep));
}

} // namespace

void HostAccess::settle() {
  const int device = current_device();
  if (pending_requests[device].load(std::memory_order_relaxed) == 0) return;
  for (int s = 0; s < kStreams; ++s) {
    Queue& q = queue(device, s);
    std::lock_guard<std::mutex> lock(q.mu);
    if (!q.requests.empty()) run_ready(q, device, 0, &rt::device(device).stream(s));
  }
}

void segment_mapped(int device, char* p, size_t bytes) {
  runtime::memcheck::DeviceAccess access;
  std::memset(p, kPoison, bytes);
}

void segment_unmapped(int device, char* p, size_t bytes) {
  for (int s = 0; s < kStreams; ++s) {
    Queue& q = queue(device, s);
    std::lock_guard<std::mutex> lock(q.mu);
    auto& rs = q.requests;
    const auto n0 = rs.size();
    rs.erase(std::remove_if(rs.begin(), rs.end(),
                            [&](const Request& r) { return overlaps(uintptr_t(r.p), r.n, uintptr_t(p), bytes); }),
             rs.end());
    pending_requests[device].fetch_sub(static_cast<int>(n0 - rs.size()), std::memory_order_relaxed);
  }
  std::lock_guard<std::mutex> lock(table_mu);
  freed.erase(freed.lower_bound(uintptr_t(p)), freed.lower_bound(uintptr_t(p) + bytes));
}

void block_allocated(int device, int stream, char* p, size_t size, size_t requested, HistoryContext context) {
  Request check{Request::Check, 0, p, size};
  {
    std::lock_guard<std::mutex> lock(table_mu);
    const auto a = reinterpret_cast<uintptr_t>(p);
    Live b;
    b.device = device, b.stream = stream, b.size = size, b.requested = requested;
    b.id = check.id = ++next_id;
    b.alloc_ns = rt::now_ns();
    b.alloc = std::move(context);
    auto first = freed.upper_bound(a);
    if (first != freed.begin() && std::prev(first)->first + std::prev(first)->second.size > a) --first;
    auto last = freed.lower_bound(a + size);
    for (auto it = first; it != last; ++it) {
      for (OtherUse& u : it->second.other_uses) b.other_uses.push_back(std::move(u));
      b.previous.emplace_back(it->first, it->second.size, it->second.free);
      check.previous.emplace_back(it->first, std::move(it->second));
    }
    freed.erase(first, last);
    live[a] = std::move(b);
  }
  rt::Stream& s = rt::device(device).stream(stream);
  bool unpoisoned;
  {
    Queue& q = queue(device, stream);
    std::lock_guard<std::mutex> lock(q.mu);
    unpoisoned = cancel_poison(q, device, p, size);
  }
  if (unpoisoned) {
    // Tasks queued before may still write the memory: no check, and the
    // canary goes in once they ran.
    ++n_unchecked;
    push(device, stream, {Request::Arm, s.last_enqueued(), p + requested, size - requested, check.id});
  } else {
    // Any task that had not started may be one the new owner joins (the
    // fuser amends a queued task): check before the first of them.
    check.after = s.last_enqueued() - s.pending();
    push(device, stream, std::move(check));
  }
}

void block_freed(char* p, HistoryContext context) {
  std::lock_guard<std::mutex> lock(table_mu);
  auto it = live.find(reinterpret_cast<uintptr_t>(p));
  if (it == live.end()) return;
  Live& b = it->second;
  for (OtherUse& u : b.first_calls_elsewhere)  // record_stream since makes the allocator wait for that stream
    if (!recorded_on(b.recorded, u.stream)) b.other_uses.push_back(std::move(u));
  freed[it->first] = Freed{b.device,           b.stream,           b.size,
                           b.requested,        rt::now_ns(),       std::move(b.recorded),
                           std::move(b.tensor), std::move(b.alloc), std::move(context),
                           std::move(b.other_uses)};
  live.erase(it);
}

void block_released(int device, int stream, char* p, size_t size) {
  rt::Device& d = rt::device(device);
  Request poison{Request::Poison, d.stream(stream).last_enqueued(), p, size};
  for (int s = 0; s < kStreams; ++s)
    if (rt::Stream* other = d.made_stream(s); other && s != stream && !other->query())
      poison.others.emplace_back(s, other->last_enqueued());
  push(device, stream, std::move(poison));
}

void block_recorded(char* p, int stream) {
  std::lock_guard<std::mutex> lock(table_mu);
  if (auto it = live.find(reinterpret_cast<uintptr_t>(p)); it != live.end() && !recorded_on(it->second.recorded, stream))
    it->second.recorded.push_back(stream);
}

void name_block(const at::Tensor& fresh) {
  const void* p = fresh.storage().data();
  if (!p) return;
  std::string shape;
  for (int64_t n : fresh.sizes()) shape += (shape.empty() ? "" : ", ") + std::to_string(n);
  if (fresh.dim() == 1) shape += ",";  // Python's spelling of a 1-tuple
  std::string name = "a (" + shape + ") " + std::string(c10::getDtypeNames(fresh.scalar_type()).first) + " tensor";
  std::lock_guard<std::mutex> lock(table_mu);
  if (auto it = live.find(reinterpret_cast<uintptr_t>(p)); it != live.end()) it->second.tensor = std::move(name);
}

void viewed(const void* data) {
  if (!data) return;
  if (t_current.task)
    t_current.views.push_back(reinterpret_cast<uintptr_t>(data));
  else if (t_first_call.depth > 0)
    t_first_call.views.push_back(reinterpret_cast<uintptr_t>(data));
}

void FirstCall::begin(c10::DeviceIndex device, const std::string& op) {
  CurrentFirstCall& c = t_first_call;
  if (c.depth > 0) {
    ++c.depth;
    return;
  }
  const rt::Stream& stream = current_runtime_stream(device);  // before the scope counts: it may throw
  c.depth = 1;
  c.device = device;
  c.stream = stream.id();
  c.tail = stream.last_enqueued();  // the call runs once the stream finished it
  c.op = &op;
  c.views.clear();
}

void FirstCall::end(bool queues) {
  CurrentFirstCall& c = t_first_call;
  if (--c.depth > 0) return;
  if (!queues || c.views.empty()) {
    c.views.clear();
    return;
  }
  try {
    std::sort(c.views.begin(), c.views.end());
    c.views.erase(std::unique(c.views.begin(), c.views.end()), c.views.end());
    const Position at = after_task(c.tail);
    std::lock_guard<std::mutex> lock(table_mu);
    Position& host_work = stream_orders[{c.device, c.stream}].host_work;
    host_work = std::max(host_work, at);
    for (uintptr_t v : c.views) {
      auto it = containing(live, v);
      if (it == live.end()) continue;
      Live& b = it->second;
      if (b.stream == c.stream) {
        if (b.first_use == 0) first_use(c.device, it->first, b, at);
        continue;
      }
      if (recorded_on(b.recorded, c.stream)) continue;
      auto& uses = b.first_calls_elsewhere;
      auto same = std::find_if(uses.begin(), uses.end(), [&](const OtherUse& u) { return u.stream == c.stream; });
      if (same == uses.end())
        uses.push_back({c.stream, at, *c.op, true});
      else if (same->at < at)
        *same = {c.stream, at, *c.op, true};
    }
  } catch (...) {
    // A checker's failure (out of host memory) must not fail the call.
  }
  c.views.clear();
}

void set_gather(GatherContextFn g) { gather_fn.store(g); }

void grant_parallel_workers() {
#pragma omp parallel
  if (omp_get_thread_num() > 0) runtime::memcheck::grant_thread();
}
HistoryContext gather_stack() { return gather(); }

std::vector<Report> take_reports() {
  std::lock_guard<std::mutex> lock(reports_mu);
  return std::exchange(reports, {});
}

void set_report_notifier(void (*notify)()) { notifier.store(notify); }

Stats stats() { return {n_poisoned.load(), n_checked.load(), n_unchecked.load(), n_canary.load(), n_reports.load()}; }

namespace {
struct Install {
  Install() {
    if (!runtime::memcheck::enabled_at_load()) return;
    runtime::memcheck::set_task_hook(task_hook);
    runtime::memcheck::set_wait_hook(wait_hook);
    runtime::memcheck::set_follow_hook(follow_hook);
    runtime::memcheck::set_fault_reporter(on_fault);
  }
} install;
} // namespace

} // namespace torchneuron::memcheck
