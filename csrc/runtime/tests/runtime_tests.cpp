// Unit tests of the torch-free runtime. A tiny harness keeps the runtime free of
// test-framework dependencies: each TEST registers itself; main runs them all.
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "memcheck.h"
#include "runtime.h"

using namespace torchneuron::runtime;

namespace {
std::vector<std::pair<const char*, std::function<void()>>>& registry() {
  static std::vector<std::pair<const char*, std::function<void()>>> r;
  return r;
}
struct Register {
  Register(const char* name, std::function<void()> fn) { registry().emplace_back(name, std::move(fn)); }
};
#define TEST(name)                                   \
  void test_##name();                                \
  Register register_##name(#name, test_##name);      \
  void test_##name()
#define CHECK(cond)                                                                      \
  do {                                                                                   \
    if (!(cond)) throw std::runtime_error(std::string(__FILE__) + ":" +                  \
                                          std::to_string(__LINE__) + ": CHECK(" #cond ")"); \
  } while (0)
template <class E, class F>
std::string expect_throw(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  throw std::runtime_error("expected an exception that was not thrown");
}
bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }
void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

DeviceProperties props(size_t capacity) {
  DeviceProperties p;
  p.name = "test";
  p.total_memory = capacity;
  return p;
}
} // namespace

TEST(visible_cores_syntax) {
  CHECK((parse_visible_cores("0-3") == std::vector<int>{0, 1, 2, 3}));
  CHECK((parse_visible_cores("0,2") == std::vector<int>{0, 2}));
  CHECK((parse_visible_cores(" 5 ") == std::vector<int>{5}));
  CHECK((parse_visible_cores("0-1,4") == std::vector<int>{0, 1, 4}));
  CHECK(parse_visible_cores("0-63").size() == static_cast<size_t>(kMaxDevices));
  for (const char* bad : {"", "a", "3-1", "0,,1", "0,0", "1-", "-1", "999", "128", "0-64", "0-127"}) {
    auto msg = expect_throw<ConfigError>([&] { parse_visible_cores(bad); });
    CHECK(contains(msg, "NEURON_RT_VISIBLE_CORES"));
  }
  CHECK(contains(expect_throw<ConfigError>([] { parse_visible_cores("0-64"); }), "65 cores listed, at most 64"));
}

TEST(machine_names) {
  CHECK(parse_machine("Trainium3").key == "trn3");
  CHECK(contains(expect_throw<ConfigError>([] { parse_machine("gpu"); }), "TORCHNEURON_MACHINE='gpu' is invalid"));
  CHECK(contains(expect_throw<ConfigError>([] { parse_machine("v9", "TORCHNEURON_NKI_TARGET"); }),
                 "TORCHNEURON_NKI_TARGET='v9' is invalid"));
}

TEST(device_memory_within_the_host) {
  const size_t host = 23ull << 30;
  CHECK(parse_hbm_bytes("8G", 2, host) == (8ull << 30));
  CHECK(parse_hbm_bytes("11776M", 2, host) == (11776ull << 20));  // exactly half each
  auto msg = expect_throw<ConfigError>([&] { parse_hbm_bytes("1T", 2, host); });
  CHECK(contains(msg, "TORCHNEURON_HBM_BYTES='1T' is invalid") && contains(msg, "23.0 GiB"));
  expect_throw<ConfigError>([&] { parse_hbm_bytes("12G", 2, host); });  // 24 GiB in all
  expect_throw<ConfigError>([&] { parse_hbm_bytes("4.5G", 1, host); });
}

TEST(durations) {
  CHECK(parse_seconds("X", "60") == 60 && parse_seconds("X", "0.5") == 0.5 && parse_seconds("X", "0") == 0);
  for (const char* bad : {"-1", "soon", "5s", "nan", " 5", ""})
    CHECK(contains(expect_throw<ConfigError>([&] { parse_seconds("TORCHNEURON_EXIT_TIMEOUT", bad); }),
                   "TORCHNEURON_EXIT_TIMEOUT='"));
}

TEST(on_off_settings) {
  CHECK(parse_flag("X", "1") && !parse_flag("X", "0") && !parse_flag("X", ""));
  // the Neuron runtime's booleans: 0, 1, false, true in any case
  CHECK(parse_flag("X", "true") && parse_flag("X", "TRUE") && !parse_flag("X", "False"));
  for (const char* bad : {"yes", "on", "2", " 1", "truee"})
    CHECK(contains(expect_throw<ConfigError>([&] { parse_flag("NEURON_LAUNCH_BLOCKING", bad); }),
                   "NEURON_LAUNCH_BLOCKING='"));
}

TEST(logical_core_size) {
  const Machine trn2 = parse_machine("trn2"), trn3 = parse_machine("trn3"), trn1 = parse_machine("trn1");
  CHECK(trn2.default_lnc == 2 && trn3.default_lnc == 2 && trn1.default_lnc == 1);
  CHECK(parse_lnc("NEURON_LOGICAL_NC_CONFIG", "1", trn2) == 1 && parse_lnc("NEURON_LOGICAL_NC_CONFIG", "2", trn3) == 2);
  for (const char* bad : {"3", "0", "", "two", " 2", "2.0"})
    CHECK(contains(expect_throw<ConfigError>([&] { parse_lnc("NEURON_LOGICAL_NC_CONFIG", bad, trn2); }),
                   "expected 1 or 2"));
  CHECK(contains(expect_throw<ConfigError>([&] { parse_lnc("NEURON_LOGICAL_NC_CONFIG", "2", trn1); }),
                 "NEURON_LOGICAL_NC_CONFIG='2' is invalid: trn1 (NeuronCore-v2) supports only 1"));
  // unset: the machine's; one name or the other; both alike; both different is an error naming both
  CHECK(resolve_lnc(nullptr, nullptr, trn2) == 2 && resolve_lnc("", "", trn1) == 1);
  CHECK(resolve_lnc("1", nullptr, trn2) == 1 && resolve_lnc(nullptr, "1", trn2) == 1 && resolve_lnc("1", "1", trn3) == 1);
  auto msg = expect_throw<ConfigError>([&] { resolve_lnc("2", "1", trn2); });
  CHECK(contains(msg, "NEURON_RT_VIRTUAL_CORE_SIZE='1' is invalid") && contains(msg, "NEURON_LOGICAL_NC_CONFIG='2'"));
  CHECK(contains(expect_throw<ConfigError>([&] { resolve_lnc(nullptr, "4", trn2); }),
                 "NEURON_RT_VIRTUAL_CORE_SIZE='4' is invalid"));
}

TEST(core_count_and_logical_core_ids) {
  CHECK(parse_num_cores("4", 2) == 4 && parse_num_cores("0", 2) == 0 && parse_num_cores("64", 2) == 64);
  for (const char* bad : {"abc", "", "-1", "4 ", "1.5"})
    CHECK(contains(expect_throw<ConfigError>([&] { parse_num_cores(bad, 2); }), "expected a whole number"));
  // 64 logical cores at LNC=2 (128 physical), 128 at LNC=1 of which a process takes at most kMaxDevices
  CHECK(contains(expect_throw<ConfigError>([] { parse_num_cores("65", 2); }),
                 "65 cores requested, the emulated instance has 64 logical NeuronCores at NEURON_LOGICAL_NC_CONFIG=2"));
  CHECK(contains(expect_throw<ConfigError>([] { parse_num_cores("65", 1); }), "at most 64 are supported"));
  CHECK(contains(expect_throw<ConfigError>([] { parse_num_cores("129", 1); }), "has 128 logical NeuronCores"));
  check_visible_cores("60-63", {60, 61, 62, 63}, 2);
  check_visible_cores("100", {100}, 1);
  CHECK(contains(expect_throw<ConfigError>([] { check_visible_cores("64", {64}, 2); }),
                 "NEURON_RT_VISIBLE_CORES='64' is invalid: core id 64 is above 63"));
}

TEST(byte_sizes) {
  CHECK(parse_bytes("X", "4G") == (4ull << 30));
  CHECK(parse_bytes("X", "512MiB") == (512ull << 20));
  CHECK(parse_bytes("X", "1024") == 1024);
  expect_throw<ConfigError>([] { parse_bytes("X", "lots"); });
  expect_throw<ConfigError>([] { parse_bytes("X", "0"); });
  expect_throw<ConfigError>([] { parse_bytes("X", "3Q"); });
  expect_throw<ConfigError>([] { parse_bytes("X", "-1"); });
  expect_throw<ConfigError>([] { parse_bytes("X", "1.5G"); });
  CHECK(contains(expect_throw<ConfigError>([] { parse_bytes("X", "99999999999999T"); }), "too large"));
}

TEST(memory_accounting_and_out_of_memory) {
  Device d(props(8 << 20), false);
  void* a = d.map(4 << 20);
  void* b = d.map(2 << 20);
  CHECK(d.mapped_bytes() == (6u << 20));
  CHECK(d.contains(static_cast<char*>(a) + 100) && d.contains(b) && !d.contains(&d));
  std::memset(a, 1, 4 << 20);  // the memory is real
  auto msg = expect_throw<OutOfMemoryError>([&] { d.map(4 << 20); });
  CHECK(contains(msg, "out of device memory"));
  CHECK(d.mapped_bytes() == (6u << 20));  // a failed map leaves no trace
  d.unmap(a);
  CHECK(d.mapped_bytes() == (2u << 20));
  void* c = d.map(6 << 20);  // fits again
  d.unmap(b);
  d.unmap(c);
  CHECK(d.mapped_bytes() == 0);
  expect_throw<UsageError>([&] { d.unmap(&d); });
}

TEST(stream_runs_tasks_in_order_asynchronously) {
  Device d(props(1 << 20), false);
  Stream& s = d.stream(0);
  std::vector<int> order;
  std::atomic<bool> release{false};
  s.enqueue("gate", [&] { while (!release) std::this_thread::yield(); });
  for (int i = 0; i < 100; ++i) s.enqueue("t", [&order, i] { order.push_back(i); });
  CHECK(!s.query());  // the host returned while the device is still busy
  CHECK(s.pending() > 0);
  release = true;
  s.synchronize();
  CHECK(s.query());
  CHECK(order.size() == 100);
  for (int i = 0; i < 100; ++i) CHECK(order[i] == i);
}

TEST(pending_tail_can_be_amended_before_it_starts) {
  Device d(props(1 << 20), false);
  Stream& s = d.stream(0);
  std::atomic<bool> release{false};
  int value = 0;
  s.enqueue("gate", [&] { while (!release) std::this_thread::yield(); });
  s.enqueue("set", [&] { value = 1; });
  bool amended = s.amend_pending_tail([&](Task& t) {
    t.run = [first = std::move(t.run), &value]() mutable {
      first();
      value += 10;
    };
    t.name += "+add";
    return true;
  });
  CHECK(amended);
  release = true;
  s.synchronize();
  CHECK(value == 11);
  CHECK(!s.amend_pending_tail([](Task&) { return true; }));  // nothing pending
}

// Open work that records the frees it hears about.
struct RecordingWork final : OpenWork {
  int64_t linger = 0;
  std::vector<std::pair<const void*, size_t>> freed;
  void on_free(const void* ptr, size_t nbytes) override { freed.emplace_back(ptr, nbytes); }
  int64_t linger_ns() const override { return linger; }
};

TEST(open_task_hears_frees_only_while_it_is_the_waiting_tail) {
  Device d(props(1 << 20), false);
  Stream& s = d.stream(0);
  std::atomic<bool> release{false};
  s.enqueue("gate", [&] { while (!release) std::this_thread::yield(); });
  auto work = std::make_shared<RecordingWork>();
  Task t;
  t.name = "open";
  t.run = [] {};
  t.open = work;
  s.enqueue(std::move(t));
  int x = 0;
  s.notify_free(&x, 4);
  CHECK(work->freed.size() == 1 && work->freed[0].first == &x && work->freed[0].second == 4);
  s.enqueue("closed", [] {});  // no longer the tail: hears nothing
  s.notify_free(&x, 8);
  CHECK(work->freed.size() == 1);
  release = true;
  s.synchronize();
  s.notify_free(&x, 16);  // started and done: hears nothing
  CHECK(work->freed.size() == 1);
}

TEST(lingering_task_gathers_amendments_until_time_a_waiter_or_more_work) {
  Device d(props(1 << 20), false);
  Stream& s = d.stream(0);
  std::atomic<int> ran{0};
  auto lingering = [&](int64_t linger_ms) {
    auto work = std::make_shared<RecordingWork>();
    work->linger = linger_ms * 1'000'000;
    Task t;
    t.name = "group";
    t.run = [&] { ++ran; };
    t.open = std::move(work);
    s.enqueue(std::move(t));
  };
  // Held back while amended; a waiting host starts it at once.
  lingering(300);
  sleep_ms(20);
  CHECK(ran == 0);
  CHECK(s.amend_pending_tail([](Task&) { return true; }));
  const auto t0 = std::chrono::steady_clock::now();
  s.synchronize();
  CHECK(ran == 1);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(200));
  // Another task behind it ends the wait.
  lingering(300);
  sleep_ms(20);
  s.enqueue("next", [&] { ++ran; });
  sleep_ms(100);
  CHECK(ran == 3);
  // And so does time.
  lingering(5);
  sleep_ms(100);
  CHECK(ran == 4);
}

TEST(events_order_work_across_streams) {
  Device d(props(1 << 20), false);
  Stream& producer = d.stream(1);
  Stream& consumer = d.stream(2);
  std::atomic<int> data{0};
  int seen = -1;
  producer.enqueue("slow_write", [&] { sleep_ms(50); data = 42; });
  Event e;
  e.record(producer);
  CHECK(!e.query());
  e.block(consumer);
  consumer.enqueue("read", [&] { seen = data; });
  consumer.synchronize();
  CHECK(seen == 42);
  CHECK(e.query());
}

TEST(unrecorded_event_is_complete) {
  Device d(props(1 << 20), false);
  Event e;
  CHECK(e.query());
  e.synchronize();
  e.block(d.stream(0));
}

TEST(elapsed_time_uses_device_timestamps) {
  Device d(props(1 << 20), false);
  Stream& s = d.stream(0);
  Event start(true), end(true);
  start.record(s);
  s.enqueue("sleep", [] { sleep_ms(30); });
  end.record(s);
  expect_throw<UsageError>([&] { (void)start.elapsed_ms(end); });  // not done yet
  end.synchronize();
  double ms = start.elapsed_ms(end);
  CHECK(ms >= 29.0 && ms < 1000.0);
  Event untimed;
  untimed.record(s);
  untimed.synchronize();
  expect_throw<UsageError>([&] { (void)start.elapsed_ms(untimed); });
}

TEST(task_errors_are_sticky_and_all_kept) {
  Device d(props(1 << 20), false);
  Stream& s = d.stream(0);
  bool later_ran = false;
  s.enqueue("aten::bad_op", [] { throw std::out_of_range("index 7 is out of bounds"); });
  s.enqueue("aten::next", [&] { later_ran = true; });
  auto msg = expect_throw<AsyncError>([&] { s.synchronize(); });
  CHECK(contains(msg, "aten::bad_op") && contains(msg, "index 7 is out of bounds"));
  CHECK(later_ran);
  CHECK(d.errors().unreported == 0);
  // Sticky: every synchronising call raises it again (stream, device, event),
  // and a second failure is kept behind the first.
  s.enqueue("aten::other", [] { throw std::runtime_error("boom"); });
  d.stream(3).enqueue("aten::side", [] { throw std::invalid_argument("side"); });
  CHECK(contains(expect_throw<AsyncError>([&] { d.synchronize(); }), "2 later task(s) failed too"));
  Event e;
  e.record(s);
  CHECK(contains(expect_throw<AsyncError>([&] { e.synchronize(); }), "aten::bad_op"));
  Device::Errors taken = d.take_errors();
  CHECK(taken.total == 3 && taken.kept.size() == 3 && taken.kept[0].task == "aten::bad_op");
  const auto& side = taken.kept[1].stream == 3 ? taken.kept[1] : taken.kept[2];  // the streams run concurrently
  CHECK(side.task == "aten::side" && side.stream == 3);
  // The task's own exception travels with the error.
  try {
    std::rethrow_exception(taken.kept[0].cause);
  } catch (const std::out_of_range&) {
  }
  s.synchronize();  // cleared
  d.stream(3).synchronize();
}

// A host waiting for the last of many tasks sleeps until that one is done: it
// is not woken by each task before it (which, on a host with few cores, takes
// a core from the device once per task), and a host waiting for an earlier
// task still wakes when that one is done.
TEST(a_waiting_host_wakes_when_its_task_is_done_not_at_each_before_it) {
  Device d(props(1 << 20), false);
  Stream& s = d.stream(0);
  std::atomic<bool> release{false};
  s.enqueue("gate", [&] { while (!release) std::this_thread::yield(); });
  uint64_t early = 0;
  for (int i = 0; i < 200; ++i) {
    const uint64_t seq = s.enqueue("t", [] { std::this_thread::sleep_for(std::chrono::microseconds(100)); });
    if (i == 20) early = seq;
  }
  std::atomic<bool> last_done_when_early_returned{true};
  std::thread early_waiter([&] {
    s.wait_until(early);
    last_done_when_early_returned = s.query();
  });
  auto switches = [] {
    rusage u{};
    getrusage(RUSAGE_THREAD, &u);
    return u.ru_nvcsw;
  };
  const long before = switches();
  release = true;
  s.wait_until(s.last_enqueued());
  const long slept = switches() - before;
  early_waiter.join();
  CHECK(!last_done_when_early_returned);
  CHECK(slept < 20);  // once per task would be about 200
}

TEST(waits_honour_deadlines_interrupts_and_cancellation) {
  Device d(props(1 << 20), false);
  Stream& s = d.stream(0);
  std::atomic<bool> release{false};
  s.enqueue("hold", [&] { while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1)); });
  int ran = 0;
  for (int i = 0; i < 5; ++i) s.enqueue("queued", [&] { ++ran; });
  CHECK(!s.wait_until(s.last_enqueued(), now_ns() + 20'000'000));
  CHECK(!d.wait_idle(now_ns() + 1'000'000));
  static std::atomic<int> checks{0};
  set_wait_interrupt_check([] {
    if (++checks == 2) throw std::runtime_error("interrupted");
  });
  expect_throw<std::runtime_error>([&] { s.wait_until(s.last_enqueued()); });
  set_wait_interrupt_check(nullptr);
  CHECK(d.cancel_pending() >= 5);  // the five queued tasks are skipped, the running one finishes
  release = true;
  CHECK(d.wait_idle(Stream::kNoDeadline));
  CHECK(ran == 0 && s.query());
  s.enqueue("after", [&] { ++ran; });  // later work runs
  s.synchronize();
  CHECK(ran == 1);
}

TEST(external_task_ends_when_finished_and_reached_in_stream_order) {
  Device d(props(1 << 20), false);
  Stream& s = d.stream(0);
  s.enqueue("warm", [] {});
  s.synchronize();
  sleep_ms(5);  // the executor sleeps
  // Behind finished work with no body: the host reaches it, the finishing
  // thread completes it, and the executor is never woken. Not with the memory
  // checker on, which must see every task end: the executor completes them.
  const bool host_reaches = !memcheck::on();
  auto end = std::make_shared<ExternalEnd>();
  s.enqueue_external("gloo:all_reduce", nullptr, end);
  CHECK(!s.query());
  std::thread peer([end] {
    sleep_ms(20);
    end->finish();
  });
  s.synchronize();
  peer.join();
  CHECK(s.query() && s.pending() == (host_reaches ? 1u : 0u));
  // Finished before the executor reaches it: later tasks still wait for the
  // earlier ones, and run after it.
  std::atomic<bool> release{false};
  std::vector<int> order;
  s.enqueue("gate", [&] { while (!release) std::this_thread::yield(); order.push_back(0); });
  auto early = std::make_shared<ExternalEnd>();
  s.enqueue_external("early", nullptr, early);
  early->finish();
  early->finish(std::make_exception_ptr(std::runtime_error("ignored: the first call counts")));
  s.enqueue("after", [&] { order.push_back(1); });
  CHECK(!s.query());
  release = true;
  s.synchronize();
  CHECK((order == std::vector<int>{0, 1}));
  // Reached first (its body started the work): the next task waits for finish().
  auto late = std::make_shared<ExternalEnd>();
  std::atomic<bool> started{false}, next_ran{false};
  s.enqueue_external("late", [&] { started = true; }, late);
  s.enqueue("next", [&] { next_ran = true; });
  while (!started) std::this_thread::yield();
  sleep_ms(20);
  CHECK(!next_ran && !s.query());
  late->finish();
  s.synchronize();
  CHECK(next_ran);
  // A failure is the device's error, named after the task.
  auto failing = std::make_shared<ExternalEnd>();
  s.enqueue_external("gloo:broadcast", nullptr, failing);
  failing->finish(std::make_exception_ptr(std::runtime_error("peer 1 died")));
  auto msg = expect_throw<AsyncError>([&] { s.synchronize(); });
  CHECK(contains(msg, "gloo:broadcast") && contains(msg, "peer 1 died"));
  d.take_errors();
  // A body that throws never started the work: the task ends with its error.
  s.enqueue_external("gloo:issue", [] { throw std::invalid_argument("bad root"); }, std::make_shared<ExternalEnd>());
  CHECK(contains(expect_throw<AsyncError>([&] { s.synchronize(); }), "bad root"));
  d.take_errors();
  // Slots the host reached do not pile up while the executor sleeps.
  for (int i = 0; i < 200; ++i) {
    auto e = std::make_shared<ExternalEnd>();
    s.enqueue_external("many", nullptr, e);
    e->finish();
  }
  if (!host_reaches) s.synchronize();
  CHECK(s.query());
  sleep_ms(20);
  CHECK(s.pending() < 32);
}

TEST(a_stream_waits_for_another_streams_external_task_through_then) {
  Device d(props(1 << 20), false);
  Stream& comm = d.stream(1);
  Stream& caller = d.stream(2);
  std::atomic<bool> release{false};
  comm.enqueue("earlier", [&] { while (!release) std::this_thread::yield(); });
  auto collective = std::make_shared<ExternalEnd>();
  comm.enqueue_external("all_reduce", nullptr, collective);
  auto waiter = std::make_shared<ExternalEnd>();
  caller.enqueue_external("c10d_wait", nullptr, waiter);
  collective->then(waiter);
  std::atomic<int> read{0};
  caller.enqueue("read", [&] { read = 1; });
  collective->finish();  // the engine is done, but `comm` has not reached the task yet
  sleep_ms(20);
  CHECK(!caller.query() && read == 0);
  release = true;
  caller.synchronize();
  CHECK(read == 1 && comm.query());
  // Already done: then() finishes the next task at once.
  auto late = std::make_shared<ExternalEnd>();
  caller.enqueue_external("late_wait", nullptr, late);
  collective->then(late);
  caller.synchronize();
}

TEST(a_destroyed_stream_stops_waiting_for_an_external_end) {
  auto end = std::make_shared<ExternalEnd>();
  {
    Device d(props(1 << 20), false);
    d.stream(0).enqueue_external("never", [] {}, end);
    sleep_ms(5);
  }  // returns: the executor gave up on it
  end->finish();  // too late: nothing happens
}

TEST(launch_blocking_runs_each_task_before_returning) {
  Device d(props(1 << 20), true);
  Stream& s = d.stream(0);
  int value = 0;
  s.enqueue("set", [&] { value = 5; });
  CHECK(value == 5);
  CHECK(s.query());
  auto msg = expect_throw<AsyncError>([&] { s.enqueue("aten::fails", [] { throw std::runtime_error("x"); }); });
  CHECK(contains(msg, "aten::fails"));
}

TEST(stream_pool_and_bounds) {
  Device d(props(1 << 20), false);
  for (int i = 0; i < 100; ++i) {
    int id = d.next_pool_stream();
    CHECK(id >= 1 && id < Device::kStreams);
  }
  expect_throw<UsageError>([&] { d.stream(Device::kStreams); });
}

TEST(many_streams_run_concurrently) {
  Device d(props(1 << 20), false);
  std::atomic<int> running{0}, peak{0};
  for (int i = 1; i <= 4; ++i)
    d.stream(i).enqueue("overlap", [&] {
      int now = ++running;
      int p = peak.load();
      while (now > p && !peak.compare_exchange_weak(p, now)) {}
      sleep_ms(40);
      --running;
    });
  d.synchronize();
  CHECK(peak.load() >= 2);
}

// Several hosts issue bursts that span many queue segments while another
// amends the newest task: every task runs once, each host's in its order, and
// an amendment lands only on a task that had not started.
TEST(queue_keeps_order_across_hosts_segments_and_amendments) {
  Device d(props(1 << 20), false);
  Stream& s = d.stream(0);
  constexpr int kHosts = 3, kTasks = 5000;
  std::vector<int> last(kHosts, -1);  // written by the executor only
  std::atomic<int> out_of_order{0}, ran{0}, amended_ran{0}, amendments{0};
  std::atomic<bool> hosts_done{false};
  std::thread amender([&] {
    while (!hosts_done)
      amendments += s.amend_pending_tail([&](Task& t) {
        t.run = [first = std::move(t.run), &amended_ran]() mutable {
          first();
          ++amended_ran;
        };
        return true;
      });
  });
  std::vector<std::thread> hosts;
  for (int h = 0; h < kHosts; ++h)
    hosts.emplace_back([&, h] {
      for (int i = 0; i < kTasks; ++i)
        s.enqueue("t", [&, h, i] {
          if (last[h] != i - 1) ++out_of_order;
          last[h] = i;
          ++ran;
        });
    });
  for (auto& t : hosts) t.join();
  hosts_done = true;
  amender.join();
  s.synchronize();
  CHECK(ran == kHosts * kTasks);
  CHECK(out_of_order == 0);
  CHECK(amended_ran == amendments);
  CHECK(s.pending() == 0);
}

TEST(busy_time_is_the_union_of_the_streams_tasks) {
  BusyTime b;
  const int64_t ms = 1'000'000, t0 = 1'000'000 * ms;
  CHECK(b.utilization(t0) == 0);
  b.task_started(t0);  // two overlapping tasks: 300 ms of busy time, not 400
  b.task_started(t0 + 100 * ms);
  b.task_finished(t0 + 200 * ms);
  b.task_finished(t0 + 300 * ms);
  CHECK(b.utilization(t0 + 1000 * ms) == 30);
  b.task_started(t0 + 900 * ms);  // running now counts up to now
  CHECK(b.utilization(t0 + 1000 * ms) == 40);
  b.task_finished(t0 + 1000 * ms);
  CHECK(b.utilization(t0 + 1600 * ms) == 10);  // only what falls in the last second
  CHECK(b.utilization(t0 + 5000 * ms) == 0);   // old buckets are not read as new ones
}

TEST(utilization_follows_a_streams_work) {
  Device d(props(1 << 20), false);
  d.stream(0).enqueue("busy", [] { sleep_ms(300); });
  d.stream(0).synchronize();
  const int u = d.busy_time().utilization(now_ns());
  CHECK(u >= 25 && u <= 40);
}

TEST(shared_segment_keeps_its_address_and_contents) {
  Device d(props(8 << 20), false);
  auto* p = static_cast<unsigned char*>(d.map(1 << 20));
  for (int i = 0; i < (1 << 20); ++i) p[i] = static_cast<unsigned char>(i * 7);
  Device::SharedSegment s = d.share(p + 4096);
  CHECK(s.base == p && s.bytes == (1u << 20));
  CHECK(d.share(p).fd == s.fd);  // shared once
  auto* q = static_cast<unsigned char*>(d.map_shared(s.fd, s.bytes));  // another mapping of it, as a peer has
  CHECK(q != p && q[12345] == static_cast<unsigned char>(12345 * 7));
  p[5] = 99;
  CHECK(q[5] == 99);  // one memory
  CHECK(d.mapped_bytes() == 2u << 20);
  d.unmap(q);
  d.unmap(p);
  CHECK(d.mapped_bytes() == 0);
  expect_throw<UsageError>([&] { d.share(&s); });
}

int main() {
  int passed = 0, failed = 0;
  for (auto& [name, fn] : registry()) {
    try {
      fn();
      ++passed;
      std::printf("PASS %s\n", name);
    } catch (const std::exception& e) {
      ++failed;
      std::printf("FAIL %s: %s\n", name, e.what());
    }
  }
  std::printf("runtime: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
