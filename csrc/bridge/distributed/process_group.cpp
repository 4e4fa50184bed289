#include "process_group.h"

#include <ATen/ThreadLocalState.h>
#include <ATen/core/ivalue.h>
#include <c10/core/StreamGuard.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <thread>

#include "../allocator.h"
#include "../device_state.h"
#include "../exec/host_views.h"
#include "../sanitizers/memcheck.h"
#include "../sanitizers/stream_sanitizer.h"

namespace torchneuron {

// A collective's tensors: checked to be on one neuron device, recorded for
// the communication stream and seen as host views for gloo.
struct Operands {
  c10::DeviceIndex device = -1;
  std::vector<at::Tensor> keep;

  at::Tensor view(const at::Tensor& t) {
    TORCH_CHECK(t.device().type() == kNeuron, "the neuron backend of torch.distributed takes neuron tensors, got a ",
                t.device(), " tensor; for CPU tensors initialise with backend=\"cpu:gloo,neuron:neuron\"");
    if (device < 0) device = t.device().index();
    TORCH_CHECK(t.device().index() == device, "a collective's tensors must be on one neuron device, got neuron:",
                int(device), " and ", t.device());
    keep.push_back(t);
    return host_view(t);
  }
  std::vector<at::Tensor> view(const std::vector<at::Tensor>& ts) {
    std::vector<at::Tensor> out;
    for (const auto& t : ts) out.push_back(view(t));
    return out;
  }
  std::vector<std::vector<at::Tensor>> view(const std::vector<std::vector<at::Tensor>>& lists) {
    std::vector<std::vector<at::Tensor>> out;
    for (const auto& l : lists) out.push_back(view(l));
    return out;
  }
};

namespace {

using c10d::OpType;
using c10d::Work;
using std::chrono::milliseconds;

// How long past the group's timeout a collective's task waits for gloo before
// it gives up itself (gloo's own timeout normally fires first).
constexpr milliseconds kWatchdogGrace{3000};

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", s);
  return buf;
}

} // namespace

struct CallState {
  std::string what;  // "all_reduce on group 0 (default_pg), rank 1 of 2"
  OpType type;
  milliseconds timeout;
  rt::Stream* stream = nullptr;
  uint64_t seq = 0;  // the task's, on `stream`
  // Point-to-point: the task only issues gloo's call, `inner`, which finishes
  // on its own; a Work's wait() waits for it on the caller's stream. (Waiting
  // on the communication stream would deadlock an exchange, each rank's send
  // ahead of its receive.) `keep` holds the tensors until gloo is done.
  bool p2p = false;
  std::vector<at::Tensor> keep;
  // The others: their task ends when gloo's completion callback (or the
  // watchdog) finishes `end`, once (`ended`).
  std::shared_ptr<rt::ExternalEnd> end;
  std::atomic<bool> ended{false};
  std::chrono::steady_clock::time_point start;
  mutable std::mutex mu;
  c10::intrusive_ptr<Work> inner;
  std::exception_ptr error;
  // Collectives without outputs (barrier, send) have a host future the task
  // completes; the others' futures are the device's (NeuronWork::getFuture).
  c10::intrusive_ptr<c10::ivalue::Future> host_future;

  std::exception_ptr failure() const {
    std::lock_guard<std::mutex> lock(mu);
    return error;
  }
  c10::intrusive_ptr<Work> issued() const {
    std::lock_guard<std::mutex> lock(mu);
    return inner;
  }
};

namespace {

// A failed collective: reported on stderr at once (a rank whose host never
// synchronises still says why it stopped) and kept as a DistBackendError
// naming it, which the device keeps as its error. Returns that error.
std::exception_ptr failed(CallState& s, const std::exception& e) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - s.start).count();
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string message = "neuron backend: " + s.what + " failed after " + seconds(elapsed) + " s (timeout " +
                              seconds(s.timeout.count() / 1000.0) +
                              " s): " + (c10_error ? c10_error->what_without_backtrace() : e.what());
  std::cerr << "[torchneuron.distributed] " << message << std::endl;
  std::exception_ptr error;
  try {
    C10_THROW_ERROR(DistBackendError, message);
  } catch (...) {
    error = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.error = error;
    s.keep.clear();
  }
  if (s.host_future && !s.host_future->completed()) s.host_future->setError(error);
  return error;
}

// A point-to-point call's end: gloo's work, waited for no longer than the
// timeout and the grace.
void finish_p2p(CallState& s, const c10::intrusive_ptr<Work>& work) {
  try {
    work->wait(s.timeout + kWatchdogGrace);
  } catch (const std::exception& e) {
    std::rethrow_exception(failed(s, e));
  }
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.keep.clear();
  }
  if (s.host_future && !s.host_future->completed())
    s.host_future->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
}

// A collective's end, once: gloo's, error or not, or the watchdog's.
void end_collective(CallState& s, const std::exception_ptr& gloo_error) {
  if (s.ended.exchange(true, std::memory_order_acq_rel)) return;
  std::exception_ptr error;
  if (gloo_error) {
    try {
      std::rethrow_exception(gloo_error);
    } catch (const std::exception& e) {
      error = failed(s, e);
    } catch (...) {
      error = failed(s, std::runtime_error("unknown exception"));
    }
  } else if (s.host_future) {
    s.host_future->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
  }
  s.end->finish(error);
}

// Ends the collectives gloo has not finished by their timeout and the grace
// (gloo's own timeout normally fires first), so that no rank waits forever
// for a gloo that never returns: one thread for the process that looks once
// a second and is never woken for a collective, so a call costs one push.
// It also destroys the calls whose last reference a device thread would
// drop (release_off_device).
class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog* watchdog = new Watchdog();  // never destroyed: its thread runs until the process ends
    return *watchdog;
  }
  void watch(const std::shared_ptr<CallState>& s) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(s);  // weak: an ended call's tensors go with its Work
  }
  void bury(std::shared_ptr<CallState> s) {
    std::lock_guard<std::mutex> lock(mu_);
    graves_.push_back(std::move(s));
    graves_cv_.notify_one();
  }

 private:
  Watchdog() { std::thread([this] { loop(); }).detach(); }
  void loop() {
    auto next_look = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    for (;;) {
      std::vector<std::shared_ptr<CallState>> graves, overdue;
      {
        std::unique_lock<std::mutex> lock(mu_);
        graves_cv_.wait_until(lock, next_look, [&] { return !graves_.empty(); });
        graves.swap(graves_);
        const auto now = std::chrono::steady_clock::now();
        if (now >= next_look) {
          next_look = now + std::chrono::seconds(1);
          std::erase_if(calls_, [&](const std::weak_ptr<CallState>& weak) {
            auto s = weak.lock();
            if (!s || s->ended.load(std::memory_order_acquire)) return true;
            if (now - s->start <= s->timeout + kWatchdogGrace) return false;
            overdue.push_back(std::move(s));
            return true;
          });
        }
      }
      graves.clear();  // here, where taking the interpreter's lock blocks nobody
      for (auto& s : overdue)
        end_collective(*s, std::make_exception_ptr(std::runtime_error(
                               "gloo did not finish it within the timeout and a grace of " +
                               seconds(kWatchdogGrace.count() / 1000.0) + " s (the watchdog ended it)")));
    }
  }
  std::mutex mu_;
  std::condition_variable graves_cv_;
  std::vector<std::weak_ptr<CallState>> calls_;
  std::vector<std::shared_ptr<CallState>> graves_;
};

// Drops a device thread's reference to a call. Not the last one there:
// destroying a call can take the interpreter's lock (the tensors it keeps,
// whose Python objects PyTorch keeps alive while C++ holds them), which a
// host waiting for the device may hold, so the watchdog's thread destroys it
// instead.
struct OffDevice {
  std::shared_ptr<CallState>& s;
  ~OffDevice() {
    if (s.use_count() == 1) Watchdog::get().bury(std::move(s));
    else s.reset();
  }
};

// Has gloo's completion callback end the collective's task: on gloo's
// thread, or at once if gloo is done already; no device thread waits for it.
// A Work without a future (gloo's LambdaWork, as its reduce_scatter returns)
// is waited for on the communication stream instead, by the returned body.
rt::TaskBody await_gloo(const std::shared_ptr<CallState>& s, const c10::intrusive_ptr<Work>& work) {
  Watchdog::get().watch(s);
  c10::intrusive_ptr<c10::ivalue::Future> future;
  try {
    future = work->getFuture();
  } catch (const c10::Error&) {
  }
  if (future) {
    future->addCallback([s](c10::ivalue::Future& f) { end_collective(*s, f.hasError() ? f.exception_ptr() : nullptr); });
    return {};
  }
  return [s = s]() mutable {  // a copy it owns (not const): OffDevice drops it
    OffDevice off{s};
    std::exception_ptr error;
    try {
      s->issued()->wait(s->timeout + kWatchdogGrace);
    } catch (...) {
      error = std::current_exception();
    }
    end_collective(*s, error);
  };
}

// The thread-local state gloo's calls are made in: that of a thread of its
// own, none of the caller's. Gloo's threads take on the state of the call that
// queued a work; with the caller's Python objects in it (activation
// checkpointing's saved-tensor hooks) they take the interpreter's lock to copy
// them, which a host waiting for the device may hold (DTensor's dispatch holds
// it around each operator) while the device waits for the collective: a
// deadlock. Nor are gloo's operators on host views any concern of the
// caller's dispatch modes.
const at::ThreadLocalState& plain_state() {
  static const at::ThreadLocalState* state = [] {
    const at::ThreadLocalState* captured = nullptr;
    std::thread([&] { captured = new at::ThreadLocalState(); }).join();
    return captured;
  }();
  return *state;
}

// gloo's call. A failure is the state's error (and reported): null then.
c10::intrusive_ptr<Work> issue(CallState& s, c10d::Backend& gloo, const NeuronBackend::Launch& launch) {
  s.start = std::chrono::steady_clock::now();
  try {
    c10::intrusive_ptr<Work> work = [&] {
      at::ThreadLocalStateGuard plain(plain_state());
      return launch(gloo);
    }();
    std::lock_guard<std::mutex> lock(s.mu);
    return s.inner = work;
  } catch (const std::exception& e) {
    failed(s, e);
  }
  return nullptr;
}

// A collective's task body on its communication stream when the host did not
// make gloo's call: makes it (taking it off `unissued`), then, but for
// point-to-point, leaves the task's end to gloo's.
void run_collective(const std::shared_ptr<CallState>& s, c10d::Backend& gloo, const NeuronBackend::Launch& launch,
                    std::atomic<int>& unissued) {
  c10::intrusive_ptr<Work> work = issue(*s, gloo, launch);
  unissued.fetch_sub(1, std::memory_order_acq_rel);
  if (!work) std::rethrow_exception(s->failure());
  if (s->p2p) return;
  if (auto wait = await_gloo(s, work)) wait();
}

// A collective's Work. It holds the device tensors, its outputs are its
// result, and its future's value is the device outputs, ready in the
// communication stream's order, as a device backend's future is.
class NeuronWork final : public Work {
 public:
  NeuronWork(std::shared_ptr<CallState> state, c10::Stream comm, std::vector<at::Tensor> keep,
             std::vector<at::Tensor> outputs)
      : Work(-1, state->type), state_(std::move(state)), comm_(comm), keep_(std::move(keep)),
        outputs_(std::move(outputs)) {}

  bool isCompleted() override {
    if (!state_->stream->is_complete(state_->seq)) return false;
    auto inner = state_->p2p ? state_->issued() : nullptr;
    return !inner || inner->isCompleted();
  }
  bool isSuccess() const override { return !state_->failure(); }
  std::exception_ptr exception() const override { return state_->failure(); }
  int sourceRank() const override {
    host_wait(::kNoTimeout);
    return state_->issued()->sourceRank();
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override { wait(::kNoTimeout); }

  // The caller's current stream waits for the collective; the host waits only
  // for a barrier (a host synchronisation) or when given a timeout.
  bool wait(milliseconds timeout) override {
    if (state_->type == OpType::BARRIER || timeout != ::kNoTimeout) host_wait(timeout);
    if (auto error = state_->failure()) std::rethrow_exception(error);
    translate_errors([&] {
      rt::Stream& caller = current_runtime_stream(comm_.device_index());
      sanitizer::log_order(comm_.device_index(), state_->stream->id(), caller.id(), state_.get());
      if (isCompleted()) {
        // a wait that is over at once, which tells the memory checker that
        // what this thread queues from now on follows the collective
        state_->stream->wait_until(state_->seq);
        return;
      }
      if (state_->p2p) {
        caller.enqueue("c10d_wait", [state = state_]() mutable {
          OffDevice off{state};
          state->stream->wait_until(state->seq);
          if (auto inner = state->issued()) finish_p2p(*state, inner);
        });
      } else if (&caller != state_->stream) {
        // ended by the collective's task: gloo's thread wakes a host waiting
        // for the caller's stream, with no executor in between
        auto waiter = std::make_shared<rt::ExternalEnd>();
        caller.enqueue_external("c10d_wait", nullptr, waiter);
        state_->end->then(std::move(waiter));
      }
    });
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (future_) return future_;
    if (outputs_.empty()) return future_ = state_->host_future;
    if (state_->p2p) host_wait(::kNoTimeout);  // a receive's future: on the host, once gloo is done
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       std::vector<c10::Device>{comm_.device()});
    if (auto error = state_->failure()) {
      future_->setError(error);
    } else {
      c10::StreamGuard on_comm(comm_);  // the future's events: on the communication stream, after the collective
      future_->markCompleted(c10::IValue(outputs_));
    }
    return future_;
  }

 private:
  void host_wait(milliseconds timeout) const {
    const int64_t deadline = timeout == ::kNoTimeout ? rt::Stream::kNoDeadline
                                                          : rt::now_ns() + int64_t(timeout.count()) * 1000000;
    bool done = translate_errors([&] { return state_->stream->wait_until(state_->seq, deadline); });
    if (done) sanitizer::log_order(comm_.device_index(), state_->stream->id(), -1, state_.get());
    if (auto inner = done && state_->p2p ? state_->issued() : nullptr) {
      const int64_t left_ms = (deadline - rt::now_ns()) / 1000000;
      done = timeout == ::kNoTimeout || left_ms > 0;
      if (done) {
        try {
          inner->wait(timeout == ::kNoTimeout ? state_->timeout + kWatchdogGrace : milliseconds(left_ms));
        } catch (const std::exception& e) {
          std::rethrow_exception(failed(*state_, e));
        }
      }
    }
    TORCH_CHECK_WITH(DistBackendError, done, "neuron backend: ", state_->what,
                     " did not finish within wait()'s timeout of ",
                     seconds(timeout.count() / 1000.0), " s");
    if (auto error = state_->failure()) std::rethrow_exception(error);
  }

  std::shared_ptr<CallState> state_;
  c10::Stream comm_;
  std::vector<at::Tensor> keep_, outputs_;
  std::mutex mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// The Work of a coalesced block: its collectives' Works, waited for in turn.
class CoalescedWork final : public Work {
 public:
  explicit CoalescedWork(std::vector<c10::intrusive_ptr<Work>> works)
      : Work(-1, OpType::COALESCED), works_(std::move(works)) {}
  bool isCompleted() override {
    return std::all_of(works_.begin(), works_.end(), [](auto& w) { return w->isCompleted(); });
  }
  bool isSuccess() const override { return !exception(); }
  std::exception_ptr exception() const override {
    for (const auto& w : works_)
      if (auto e = w->exception()) return e;
    return nullptr;
  }
  std::vector<at::Tensor> result() override {
    std::vector<at::Tensor> out;
    for (auto& w : works_)
      for (auto& t : w->result()) out.push_back(t);
    return out;
  }
  bool wait(milliseconds timeout) override {
    for (auto& w : works_) w->wait(timeout);
    return true;
  }
  void synchronize() override { wait(::kNoTimeout); }

 private:
  std::vector<c10::intrusive_ptr<Work>> works_;
};

// Argument checks at the call, those gloo makes: on the stream a bad argument
// would surface only at the next synchronising call, after the peers entered
// the collective.
template <class... Args>
void check(bool ok, const char* op, const Args&... what) {
  TORCH_CHECK(ok, "neuron backend: ", op, ": ", what...);
}
void check_like(const char* op, const at::Tensor& t, const at::Tensor& like, const char* role, size_t index) {
  check(t.scalar_type() == like.scalar_type() && t.sizes() == like.sizes(), op, role, " ", index, " has dtype ",
        t.scalar_type(), " and shape ", t.sizes(), ", expected ", like.scalar_type(), " and ", like.sizes());
}
void check_all_like(const char* op, const std::vector<at::Tensor>& ts, const at::Tensor& like, const char* role) {
  for (size_t i = 0; i < ts.size(); ++i) check_like(op, ts[i], like, role, i);
}
void check_count(const char* op, size_t n, size_t expected, const char* what) {
  check(n == expected, op, what, " holds ", n, " tensor(s), expected ", expected);
}
void check_root(const char* op, int64_t root, int size) {
  check(root >= 0 && root < size, op, "invalid root rank ", root, " for a group of size ", size);
}
// output.numel() == input.numel() * world (all_gather) or the reverse (reduce_scatter)
void check_scaled(const char* op, const at::Tensor& big, const at::Tensor& small, int size, const char* big_role) {
  check(big.scalar_type() == small.scalar_type(), op, "dtypes differ (", big.scalar_type(), " and ",
        small.scalar_type(), ")");
  check(big.numel() == small.numel() * size, op, "the ", big_role, " has ", big.numel(),
        " elements, expected the group size ", size, " times ", small.numel());
}
void check_splits(const char* op, const std::vector<int64_t>& splits, const at::Tensor& t, int size, const char* role) {
  if (splits.empty()) {
    check(t.dim() > 0 && t.size(0) % size == 0, op, "the ", role, "'s first dimension (", t.dim() ? t.size(0) : 0,
          ") does not divide by the group size ", size);
    return;
  }
  int64_t sum = 0;
  for (int64_t n : splits) {
    check(n >= 0, op, "negative split size ", n, " of the ", role);
    sum += n;
  }
  check(splits.size() == size_t(size) && t.dim() > 0 && sum == t.size(0), op, "the ", role, "'s split sizes ",
        c10::IntArrayRef(splits), " do not match its first dimension (", t.dim() ? t.size(0) : 0, ") over ", size,
        " ranks");
}

// PREMUL_SUM, which gloo refuses: the inputs multiplied by its factor, then
// SUM, as NCCL computes it. `in_place` collectives (all_reduce, reduce)
// scale their own tensors, whose values the result replaces; the others
// scale copies, leaving their inputs as they were. Run on the stream.
template <class Options>
Options premultiplied(const Options& opts, std::vector<at::Tensor>& host_inputs, bool in_place) {
  if (opts.reduceOp != c10d::ReduceOp::PREMUL_SUM) return opts;
  auto* supplement = dynamic_cast<c10d::PreMulSumSupplement*>(opts.reduceOp.supplement_.get());
  TORCH_CHECK(supplement, "neuron: a PREMUL_SUM reduction without its factor");
  const at::Tensor& t = supplement->tensor_factor;
  const at::Tensor factor = t.defined() ? (t.device().type() == kNeuron ? host_view(t) : t)
                                        : at::scalar_tensor(supplement->double_factor, at::kDouble);
  for (auto& x : host_inputs) x = in_place ? x.mul_(factor) : x.mul(factor);
  Options sum = opts;
  sum.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
  return sum;
}

std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

} // namespace

NeuronBackend::NeuronBackend(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size, milliseconds timeout)
    : c10d::Backend(rank, size), gloo_(std::move(gloo)), timeout_(timeout) {}

void NeuronBackend::setTimeout(milliseconds timeout) {
  gloo_->setTimeout(timeout);
  timeout_ = timeout;
}

// On the host, as gloo's: it reports the ranks that did not arrive in time.
void NeuronBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  gloo_->monitoredBarrier(opts, wait_all_ranks);
}

// A subgroup (split_group, a device mesh's dimensions): gloo's split, wrapped.
c10::intrusive_ptr<c10d::Backend> NeuronBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                       const std::vector<int>& ranks,
                                                       const c10::intrusive_ptr<Options>& opts) {
  auto gloo = [&] {
    runtime::memcheck::DeviceAccess access;  // the split's gloo threads inherit it
    return gloo_->split(store, ranks, opts);
  }();
  if (!gloo) return nullptr;  // this rank is not in `ranks`
  return c10::make_intrusive<NeuronBackend>(gloo, gloo->getRank(), gloo->getSize(), opts ? opts->timeout : timeout_);
}

void NeuronBackend::startCoalescing() {
  TORCH_CHECK(!coalescing_, "neuron backend: startCoalescing while coalescing already");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<Work> NeuronBackend::endCoalescing() {
  TORCH_CHECK(coalescing_, "neuron backend: endCoalescing without startCoalescing");
  coalescing_ = false;
  return c10::make_intrusive<CoalescedWork>(std::move(coalesced_));
}

int NeuronBackend::comm_stream(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  auto it = comm_streams_.find(device);
  if (it != comm_streams_.end()) return it->second;
  const int id = translate_errors([&] { return rt::device(device).next_pool_stream(); });
  return comm_streams_[device] = id;
}

c10::intrusive_ptr<Work> NeuronBackend::run(Operands& o, const char* name, OpType type, std::vector<at::Tensor> outputs,
                                            milliseconds timeout, Launch launch) {
  const c10::DeviceIndex device = o.device >= 0 ? o.device : current_device();
  const c10::Stream comm(c10::Stream::UNSAFE, c10::Device(kNeuron, device), comm_stream(device));
  auto state = std::make_shared<CallState>();
  const std::string& desc = getGroupDesc();
  state->what = std::string(name) + " on group " + getGroupUid() +
                (desc.empty() || desc == "undefined" ? "" : " (" + desc + ")") + ", rank " +
                std::to_string(getRank()) + " of " + std::to_string(getSize());
  state->type = type;
  state->timeout = timeout == c10d::kUnsetTimeout ? timeout_ : timeout;
  state->p2p = type == OpType::SEND || type == OpType::RECV || type == OpType::RECVANYSOURCE;
  if (state->p2p) {
    state->keep = o.keep;
    std::lock_guard<std::mutex> lock(streams_mu_);
    auto& live = p2p_in_flight_;
    live.erase(std::remove_if(live.begin(), live.end(),
                              [](const auto& s) {
                                auto inner = s->issued();
                                return s->failure() || (inner && inner->isCompleted());
                              }),
               live.end());
    live.push_back(state);
  }
  if (!state->p2p) state->end = std::make_shared<rt::ExternalEnd>();
  if (outputs.empty())
    state->host_future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  // the allocator reuses none of these before the communication stream is past the collective
  for (const auto& t : o.keep) device_allocator().recordStream(t.storage().data_ptr(), comm);
  translate_errors([&] {
    rt::Stream& caller = current_runtime_stream(device);
    rt::Stream& on = runtime_stream(comm);
    // With the caller's stream idle and every earlier call of the group handed
    // to gloo, the host makes gloo's call itself, as on CPU tensors: gloo runs
    // it on its own threads, and the task only waits for its end.
    const bool issue_now = !state->p2p && caller.query() && unissued_->load(std::memory_order_acquire) == 0;
    rt::TaskBody body;  // the task's: gloo's call, or a wait for gloo's end
    if (issue_now) {
      memcheck::HostAccess access;  // and what the memory checker owes the idle stream
      if (auto work = issue(*state, *gloo_, launch)) body = await_gloo(state, work);
      else state->end->finish(state->failure());
    } else {
      unissued_->fetch_add(1, std::memory_order_acq_rel);
      if (!caller.query()) {  // the collective follows the caller's queued work
        rt::Event ready;
        ready.record(caller);
        ready.block(on);
      }
    }
    // For the stream sanitizer: the collective follows the caller's queued work, on `on`.
    sanitizer::log_order(device, caller.id(), on.id(), state.get());
    sanitizer::log(sanitizer::Kind::Collective, device, on.id());
    state->stream = &on;
    if (!issue_now)
      body = [state, gloo = gloo_, launch = std::move(launch), unissued = unissued_]() mutable {
        OffDevice off{state};
        run_collective(state, *gloo, launch, *unissued);
      };
    state->seq = state->p2p ? on.enqueue(rt::TaskName(name), std::move(body))
                            : on.enqueue_external(rt::TaskName(name), std::move(body), state->end);
  });
  c10::intrusive_ptr<Work> work =
      c10::make_intrusive<NeuronWork>(std::move(state), comm, std::move(o.keep), std::move(outputs));
  if (coalescing_) coalesced_.push_back(work);
  return work;
}

c10::intrusive_ptr<Work> NeuronBackend::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  const char* op = "broadcast";
  check(!tensors.empty(), op, "no tensors");
  check_root(op, opts.rootRank, getSize());
  check(opts.rootTensor >= 0 && size_t(opts.rootTensor) < tensors.size(), op, "invalid root tensor ", opts.rootTensor);
  check_all_like(op, tensors, tensors[0], "tensor");
  Operands o;
  auto views = o.view(tensors);
  return run(o, op, OpType::BROADCAST, tensors, opts.timeout,
             [views, opts](c10d::Backend& g) mutable { return g.broadcast(views, opts); });
}

c10::intrusive_ptr<Work> NeuronBackend::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  const char* op = "all_reduce";
  check(!tensors.empty(), op, "no tensors");
  check_all_like(op, tensors, tensors[0], "tensor");
  Operands o;
  auto views = o.view(tensors);
  return run(o, op, OpType::ALLREDUCE, tensors, opts.timeout, [views, opts](c10d::Backend& g) mutable {
    const auto sum = premultiplied(opts, views, true);
    return g.allreduce(views, sum);
  });
}

c10::intrusive_ptr<Work> NeuronBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceCoalescedOptions& opts) {
  const char* op = "all_reduce_coalesced";
  check(!tensors.empty(), op, "no tensors");
  for (const auto& t : tensors)
    check(t.scalar_type() == tensors[0].scalar_type(), op, "dtypes differ (", tensors[0].scalar_type(), " and ",
          t.scalar_type(), ")");
  Operands o;
  auto views = o.view(tensors);
  return run(o, op, OpType::ALLREDUCE_COALESCED, tensors, opts.timeout, [views, opts](c10d::Backend& g) mutable {
    const auto sum = premultiplied(opts, views, true);
    return g.allreduce_coalesced(views, sum);
  });
}

c10::intrusive_ptr<Work> NeuronBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  const char* op = "reduce";
  check_root(op, opts.rootRank, getSize());
  check_count(op, tensors.size(), 1, "the tensor list");
  Operands o;
  auto views = o.view(tensors);
  return run(o, op, OpType::REDUCE, tensors, opts.timeout, [views, opts](c10d::Backend& g) mutable {
    const auto sum = premultiplied(opts, views, true);
    return g.reduce(views, sum);
  });
}

c10::intrusive_ptr<Work> NeuronBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather";
  check(!inputs.empty(), op, "no input tensors");
  check_count(op, outputs.size(), inputs.size(), "the output list");
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_count(op, outputs[i].size(), size_t(getSize()), "an output list");
    check_all_like(op, outputs[i], inputs[i], "output");
  }
  Operands o;
  auto in = o.view(inputs);
  auto out = o.view(outputs);
  return run(o, op, OpType::ALLGATHER, flat(outputs), opts.timeout,
             [out, in, opts](c10d::Backend& g) mutable { return g.allgather(out, in, opts); });
}

c10::intrusive_ptr<Work> NeuronBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_into_tensor";
  check_scaled(op, output, input, getSize(), "output");
  Operands o;
  auto in = o.view(input);
  auto out = o.view(output);
  return run(o, op, OpType::_ALLGATHER_BASE, {output}, opts.timeout,
             [out, in, opts](c10d::Backend& g) mutable { return g._allgather_base(out, in, opts); });
}

c10::intrusive_ptr<Work> NeuronBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                      std::vector<at::Tensor>& inputs,
                                                                      const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_into_tensor_coalesced";
  check_count(op, outputs.size(), inputs.size(), "the output list");
  for (size_t i = 0; i < inputs.size(); ++i) check_scaled(op, outputs[i], inputs[i], getSize(), "output");
  Operands o;
  auto in = o.view(inputs);
  auto out = o.view(outputs);
  return run(o, op, OpType::COALESCED, outputs, opts.timeout,
             [out, in, opts](c10d::Backend& g) mutable { return g.allgather_into_tensor_coalesced(out, in, opts); });
}

c10::intrusive_ptr<Work> NeuronBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_coalesced";
  check_count(op, outputs.size(), size_t(getSize()), "the output list");
  for (const auto& per_rank : outputs) {
    check_count(op, per_rank.size(), inputs.size(), "a rank's output list");
    for (size_t i = 0; i < inputs.size(); ++i) check_like(op, per_rank[i], inputs[i], "output", i);
  }
  Operands o;
  auto in = o.view(inputs);
  auto out = o.view(outputs);
  return run(o, op, OpType::ALLGATHER_COALESCED, flat(outputs), opts.timeout,
             [out, in, opts](c10d::Backend& g) mutable { return g.allgather_coalesced(out, in, opts); });
}

c10::intrusive_ptr<Work> NeuronBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  const char* op = "gather";
  check_root(op, opts.rootRank, getSize());
  check_count(op, inputs.size(), 1, "the input list");
  if (getRank() == opts.rootRank) {
    check_count(op, outputs.size(), 1, "the output list");
    check_count(op, outputs[0].size(), size_t(getSize()), "the root's gather list");
    check_all_like(op, outputs[0], inputs[0], "output");
  } else {
    check(outputs.empty(), op, "a rank other than the root got a gather list");
  }
  Operands o;
  auto in = o.view(inputs);
  auto out = o.view(outputs);
  return run(o, op, OpType::GATHER, flat(outputs), opts.timeout,
             [out, in, opts](c10d::Backend& g) mutable { return g.gather(out, in, opts); });
}

c10::intrusive_ptr<Work> NeuronBackend::scatter(std::vector<at::Tensor>& outputs,
                                              std::vector<std::vector<at::Tensor>>& inputs,
                                              const c10d::ScatterOptions& opts) {
  const char* op = "scatter";
  check_root(op, opts.rootRank, getSize());
  check_count(op, outputs.size(), 1, "the output list");
  if (getRank() == opts.rootRank) {
    check_count(op, inputs.size(), 1, "the input list");
    check_count(op, inputs[0].size(), size_t(getSize()), "the root's scatter list");
    check_all_like(op, inputs[0], outputs[0], "input");
  } else {
    check(inputs.empty(), op, "a rank other than the root got a scatter list");
  }
  Operands o;
  auto out = o.view(outputs);
  auto in = o.view(inputs);
  return run(o, op, OpType::SCATTER, outputs, opts.timeout,
             [out, in, opts](c10d::Backend& g) mutable { return g.scatter(out, in, opts); });
}

c10::intrusive_ptr<Work> NeuronBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter";
  check_count(op, outputs.size(), 1, "the output list");
  check_count(op, inputs.size(), 1, "the input list");
  check_count(op, inputs[0].size(), size_t(getSize()), "the list to scatter");
  check_all_like(op, inputs[0], outputs[0], "input");
  Operands o;
  auto out = o.view(outputs);
  auto in = o.view(inputs);
  return run(o, op, OpType::REDUCE_SCATTER, outputs, opts.timeout, [out, in, opts](c10d::Backend& g) mutable {
    std::vector<at::Tensor> scaled = in[0];
    const auto sum = premultiplied(opts, scaled, false);
    in[0] = scaled;
    return g.reduce_scatter(out, in, sum);
  });
}

c10::intrusive_ptr<Work> NeuronBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                           const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor";
  check_scaled(op, input, output, getSize(), "input");
  Operands o;
  auto out = o.view(output);
  auto in = o.view(input);
  return run(o, op, OpType::_REDUCE_SCATTER_BASE, {output}, opts.timeout, [out, in, opts](c10d::Backend& g) mutable {
    std::vector<at::Tensor> scaled{in};
    const auto sum = premultiplied(opts, scaled, false);
    return g._reduce_scatter_base(out, scaled[0], sum);
  });
}

c10::intrusive_ptr<Work> NeuronBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                      std::vector<at::Tensor>& inputs,
                                                                      const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor_coalesced";
  check_count(op, inputs.size(), outputs.size(), "the input list");
  for (size_t i = 0; i < inputs.size(); ++i) check_scaled(op, inputs[i], outputs[i], getSize(), "input");
  Operands o;
  auto out = o.view(outputs);
  auto in = o.view(inputs);
  return run(o, op, OpType::COALESCED, outputs, opts.timeout, [out, in, opts](c10d::Backend& g) mutable {
    const auto sum = premultiplied(opts, in, false);
    return g.reduce_scatter_tensor_coalesced(out, in, sum);
  });
}

c10::intrusive_ptr<Work> NeuronBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                    std::vector<int64_t>& output_splits,
                                                    std::vector<int64_t>& input_splits,
                                                    const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all_single";
  check(output.scalar_type() == input.scalar_type(), op, "dtypes differ (", input.scalar_type(), " and ",
        output.scalar_type(), ")");
  check_splits(op, output_splits, output, getSize(), "output");
  check_splits(op, input_splits, input, getSize(), "input");
  if (output_splits.empty() && input_splits.empty())
    check(output.numel() == input.numel(), op, "even splits need as many output elements as input ones, got ",
          output.numel(), " and ", input.numel());
  Operands o;
  auto out = o.view(output);
  auto in = o.view(input);
  return run(o, op, OpType::ALLTOALL_BASE, {output}, opts.timeout,
             [out, in, output_splits, input_splits, opts](c10d::Backend& g) mutable {
               return g.alltoall_base(out, in, output_splits, input_splits, opts);
             });
}

c10::intrusive_ptr<Work> NeuronBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                               const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all";
  check_count(op, outputs.size(), size_t(getSize()), "the output list");
  check_count(op, inputs.size(), size_t(getSize()), "the input list");
  for (size_t i = 0; i < inputs.size(); ++i)
    check(outputs[i].scalar_type() == inputs[i].scalar_type(), op, "dtypes differ at ", i, " (",
          inputs[i].scalar_type(), " and ", outputs[i].scalar_type(), ")");
  Operands o;
  auto out = o.view(outputs);
  auto in = o.view(inputs);
  return run(o, op, OpType::ALLTOALL, outputs, opts.timeout,
             [out, in, opts](c10d::Backend& g) mutable { return g.alltoall(out, in, opts); });
}

c10::intrusive_ptr<Work> NeuronBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const char* op = "send";
  check_count(op, tensors.size(), 1, "the tensor list");
  check_root(op, dst, getSize());
  Operands o;
  auto views = o.view(tensors);
  return run(o, op, OpType::SEND, {}, c10d::kUnsetTimeout,
             [views, dst, tag](c10d::Backend& g) mutable { return g.send(views, dst, tag); });
}

c10::intrusive_ptr<Work> NeuronBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  const char* op = "recv";
  check_count(op, tensors.size(), 1, "the tensor list");
  check_root(op, src, getSize());
  Operands o;
  auto views = o.view(tensors);
  return run(o, op, OpType::RECV, tensors, c10d::kUnsetTimeout,
             [views, src, tag](c10d::Backend& g) mutable { return g.recv(views, src, tag); });
}

c10::intrusive_ptr<Work> NeuronBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const char* op = "recv";
  check_count(op, tensors.size(), 1, "the tensor list");
  Operands o;
  auto views = o.view(tensors);
  return run(o, op, OpType::RECVANYSOURCE, tensors, c10d::kUnsetTimeout,
             [views, tag](c10d::Backend& g) mutable { return g.recvAnysource(views, tag); });
}

c10::intrusive_ptr<Work> NeuronBackend::barrier(const c10d::BarrierOptions& opts) {
  Operands o;
  return run(o, "barrier", OpType::BARRIER, {}, opts.timeout,
             [opts](c10d::Backend& g) { return g.barrier(opts); });
}

} // namespace torchneuron
