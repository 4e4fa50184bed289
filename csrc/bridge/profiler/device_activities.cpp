#include "device_activities.h"

#include <chrono>
#include <mutex>

#include "../device_state.h"

namespace torchneuron::profiler {
namespace {

struct Recording {
  std::mutex mu;
  std::vector<DeviceActivity> kept;
  int64_t unix_minus_steady_ns = 0;  // converts the runtime's clock (now_ns) to Unix time
};

Recording& recording() {
  static Recording* r = new Recording();  // executor threads may report during exit
  return *r;
}

void keep(int device, int stream, const rt::Task& task) {
  Recording& r = recording();
  std::lock_guard<std::mutex> lock(r.mu);
  const int64_t shift = r.unix_minus_steady_ns;
  r.kept.push_back(DeviceActivity{task.name.str(), device, stream, task.launcher.tag, task.launcher.thread,
                                  task.enqueued_ns + shift, task.started_ns + shift, task.finished_ns + shift});
}

thread_local std::vector<uint64_t> t_tags;

} // namespace

void start_recording() {
  Recording& r = recording();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.kept.clear();
    const int64_t unix_now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::system_clock::now().time_since_epoch()).count();
    r.unix_minus_steady_ns = unix_now - rt::now_ns();
  }
  if (device_count() > 0) rt::set_task_observer(&keep);
}

std::vector<DeviceActivity> stop_recording() {
  rt::set_task_observer(nullptr);
  Recording& r = recording();
  std::lock_guard<std::mutex> lock(r.mu);
  return std::move(r.kept);
}

void push_launch_tag(uint64_t tag) {
  t_tags.push_back(tag);
  rt::set_launch_tag(tag);
}

void pop_launch_tag() {
  if (!t_tags.empty()) t_tags.pop_back();
  rt::set_launch_tag(t_tags.empty() ? 0 : t_tags.back());
}

} // namespace torchneuron::profiler
