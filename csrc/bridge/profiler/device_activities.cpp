#include "device_activities.h"

#include <charconv>
#include <chrono>
#include <mutex>
#include <string_view>

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

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

std::optional<uint64_t> parse_uint(std::string_view s) {
  s = trim(s);
  uint64_t value = 0;
  auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || error != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return value;
}

std::optional<bool> parse_bool(std::string_view s) {
  s = trim(s);
  if (s == "true" || s == "1") return true;
  if (s == "false" || s == "0") return false;
  return std::nullopt;
}

// "0,1,2-5": indices and inclusive ranges.
std::optional<std::set<int>> parse_cores(std::string_view s) {
  std::set<int> cores;
  for (size_t at = 0; at <= s.size();) {
    const size_t end = std::min(s.find(',', at), s.size());
    const std::string_view item = trim(s.substr(at, end - at));
    const size_t dash = item.find('-');
    const auto first = parse_uint(item.substr(0, dash));
    const auto last = dash == std::string_view::npos ? first : parse_uint(item.substr(dash + 1));
    if (!first || !last || *first > *last || *last > 65535) return std::nullopt;
    for (uint64_t c = *first; c <= *last; ++c) cores.insert(static_cast<int>(c));
    at = end + 1;
  }
  return cores;
}

std::mutex g_report_mu;
SessionReport g_report;

} // namespace

SessionOptions parse_session_options(const std::string& custom_config) {
  SessionOptions options;
  const std::string_view text = trim(custom_config);
  if (text.empty() || text.front() == '{') return options;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find(';', at), text.size());
    const std::string_view item = trim(text.substr(at, end - at));
    at = end + 1;
    const size_t colon = item.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view key = trim(item.substr(0, colon)), value = trim(item.substr(colon + 1));
    const auto bad = [&] {
      options.problems.push_back(std::string(key) + ": cannot read '" + std::string(value) + "'");
    };
    if (key == "capture_enabled_for_nc") {
      if (auto cores = parse_cores(value)) options.cores = std::move(cores);
      else bad();
    } else if (key == "max_events_per_nc") {
      if (auto n = parse_uint(value)) options.max_events_per_core = *n;
      else bad();
    } else if (key == "cpu_util" || key == "host_memory") {
      if (auto on = parse_bool(value)) (key == "cpu_util" ? options.cpu_util : options.host_memory) = *on;
      else bad();
    }
  }
  return options;
}

SessionReport last_session_report() {
  std::lock_guard<std::mutex> lock(g_report_mu);
  return g_report;
}

void set_last_session_report(SessionReport report) {
  std::lock_guard<std::mutex> lock(g_report_mu);
  g_report = std::move(report);
}

} // namespace torchneuron::profiler
