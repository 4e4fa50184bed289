// torch.profiler's view of the device: a Kineto child profiler (PyTorch's
// PrivateUse1 profiler registry) whose session turns every device task into
// a device activity, linked to the operator that launched it.
//
// Per task the trace gets what a CUDA trace has per kernel: a launch on the
// host thread (`privateuse1_runtime`, at the enqueue) and the task on its
// NeuronCore and stream (`kernel`, or `gpu_memcpy` for copies), joined by a
// flow arrow, both linked to the launching operator so that key_averages()
// adds the task's time to the operator's device time. Task args name the
// device, stream, correlation, launching operator, the kind of task (op,
// fused, compiled, nki, copy) and a fused group's members.
//
// The profiler's custom config (parse_session_options) may name the cores to
// capture, a limit of tasks per core, and host CPU and memory sampling; what a
// session kept and left out is its report, read by torch_neuronx.profiling.
#define USE_KINETO 1
// Kineto's activities format their metadata with fmt, whose compiled part
// libtorch does not export: compile it here.
#define FMT_HEADER_ONLY 1
#include <libkineto.h>
#include <output_base.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <unistd.h>

#include <map>
#include <set>
#include <string_view>

#include "../device_state.h"
#include "device_activities.h"

namespace torchneuron::profiler {
namespace {

using libkineto::ActivityType;

// What a task is, from its name (the bridge's naming of tasks).
std::string_view kind_of(std::string_view name) {
  if (name.rfind("fused:", 0) == 0) return "fused";
  if (name.rfind("compiled::", 0) == 0) return "compiled";
  if (name.rfind("nki::", 0) == 0) return "nki";
  if (name == "aten::copy_" || name == "resize_storage") return "copy";
  return "op";
}

// Event markers order streams and take timestamps; they do no work.
bool is_marker(std::string_view name) { return name == "event_record" || name == "event_wait"; }

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The host sampler's period: a few of the kernel's clock ticks (its CPU
// counters' unit), and rare enough that the sampling thread stays out of the
// profile's way.
constexpr int64_t kHostSamplePeriodNs = 50'000'000;

class NeuronSession final : public libkineto::IActivityProfilerSession {
 public:
  explicit NeuronSession(SessionOptions options) : options_(std::move(options)) {}

  void start() override {
    set_last_session_report({});  // what an earlier session reported is not this one's
    start_recording();
    sampler_.start(options_.cpu_util, options_.host_memory, kHostSamplePeriodNs);
    buffer_->span.startTime = c10::getTime();
    status_ = libkineto::TraceStatus::RECORDING;
  }
  void stop() override {
    tasks_ = stop_recording();
    samples_ = sampler_.stop();
    buffer_->span.endTime = c10::getTime();
    status_ = libkineto::TraceStatus::PROCESSING;
  }
  std::vector<std::string> errors() override { return options_.problems; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);  // no window
  }
  // Tasks launched in the capture window (a schedule's warm-up steps are
  // recorded, then left out; their tasks may run after the window opened),
  // nanoseconds since the Unix epoch.
  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked_op,
                    int64_t window_start, int64_t window_end) override {
    const int32_t pid = static_cast<int32_t>(::getpid());
    const auto in_window = [&](int64_t t) {
      return !(window_start > 0 && t < window_start) && !(window_end > 0 && t > window_end);
    };
    // capture_enabled_for_nc leaves other cores out; max_events_per_nc keeps
    // each core's newest tasks (the runtime's trace buffer drops its oldest).
    SessionReport report;
    report.valid = true;
    report.cpu_util = options_.cpu_util;
    report.host_memory = options_.host_memory;
    report.problems = options_.problems;
    std::map<int, uint64_t> to_drop;
    for (const DeviceActivity& t : tasks_) {
      if (is_marker(t.name) || !in_window(t.queued_ns)) continue;
      if (options_.cores && !options_.cores->count(t.device)) {
        ++report.other_cores;
        continue;
      }
      ++report.kept[t.device];
    }
    if (options_.max_events_per_core > 0) {
      for (auto& [device, n] : report.kept) {
        if (n <= options_.max_events_per_core) continue;
        to_drop[device] = n - options_.max_events_per_core;
        report.dropped[device] = n - options_.max_events_per_core;
        n = options_.max_events_per_core;
      }
    }
    // A sample covers the period since the one before it: those whose period
    // meets the window, so a window shorter than the period still has one.
    for (size_t i = 0; i < samples_.size(); ++i) {
      const bool after_start = !(window_start > 0 && samples_[i].time_ns < window_start);
      const bool before_end = i == 0 ? in_window(samples_[i].time_ns)
                                     : !(window_end > 0 && samples_[i - 1].time_ns > window_end);
      if (after_start && before_end) report.samples.push_back(samples_[i]);
    }
    uint64_t dropped = 0;
    for (const auto& [device, n] : report.dropped) dropped += n;
    if (dropped > 0)
      TORCH_WARN("neuron profiler: ", dropped, " device tasks were dropped (max_events_per_nc=",
                 options_.max_events_per_core, " per NeuronCore; the oldest are left out)");
    set_last_session_report(std::move(report));

    int32_t next_id = 1;
    for (const DeviceActivity& t : tasks_) {
      if (is_marker(t.name) || !in_window(t.queued_ns)) continue;
      if (options_.cores && !options_.cores->count(t.device)) continue;
      if (auto drop = to_drop.find(t.device); drop != to_drop.end() && drop->second > 0) {
        --drop->second;
        continue;
      }
      const int32_t id = next_id++;
      const libkineto::ITraceActivity* op = t.launcher_tag ? linked_op(static_cast<int32_t>(t.launcher_tag)) : nullptr;
      const std::string_view kind = kind_of(t.name);

      auto& launch = add(ActivityType::PRIVATEUSE1_RUNTIME, "neuronLaunchTask");
      launch.startTime = launch.endTime = t.queued_ns;
      launch.device = pid;
      launch.resource = launch.threadId = t.launcher_thread;
      launch.id = id;
      launch.linked = op;
      launch.flow.id = id;
      launch.flow.type = libkineto::kLinkAsyncCpuGpu;
      launch.flow.start = true;
      launch.addMetadata("correlation", id);
      launch.addMetadata("device", t.device);
      launch.addMetadata("stream", t.stream);

      auto& task = add(kind == "copy" ? ActivityType::GPU_MEMCPY : ActivityType::CONCURRENT_KERNEL,
                       kind == "copy" ? "Memcpy " + t.name : t.name);
      task.startTime = t.start_ns;
      task.endTime = t.end_ns;
      task.device = t.device;
      task.resource = t.stream;
      task.id = id;
      task.linked = op;
      task.flow.id = id;
      task.flow.type = libkineto::kLinkAsyncCpuGpu;
      task.flow.start = false;
      task.addMetadata("device", t.device);
      task.addMetadata("stream", t.stream);
      task.addMetadata("correlation", id);
      if (op) task.addMetadata("External id", op->correlationId());
      task.addMetadataQuoted("kind", std::string(kind));
      task.addMetadata("queued_us", static_cast<double>(t.queued_ns) / 1e3);
      std::string_view launched = t.name;
      if (kind == "fused") {
        std::string members = "[";
        std::string_view rest = std::string_view(t.name).substr(6);
        launched = rest.substr(0, rest.find('+'));
        for (size_t at = 0; at <= rest.size();) {
          size_t end = std::min(rest.find('+', at), rest.size());
          members += (members.size() > 1 ? ", " : "") + json_string(rest.substr(at, end - at));
          at = end + 1;
        }
        task.addMetadata("fused_members", members + "]");
      }
      task.addMetadataQuoted("operator", std::string(launched));
      rows_.insert({t.device, t.stream});
    }
    for (const auto& a : buffer_->activities) logger.handleGenericActivity(*a);
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    const int device = rows_.empty() ? 0 : rows_.begin()->first;
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{
        device, device, "neuron:" + std::to_string(device), "NeuronCore " + std::to_string(device)});
  }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> rows;
    for (const auto& [device, stream] : rows_)
      rows.push_back(libkineto::ResourceInfo{stream, stream, device, "stream " + std::to_string(stream)});
    return rows;
  }
  // Ownership of the activities passes to Kineto's trace with the buffer.
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

  void pushCorrelationId(uint64_t id) override { push_launch_tag(id); }
  void popCorrelationId() override { pop_launch_tag(); }

 private:
  libkineto::GenericTraceActivity& add(ActivityType type, const std::string& name) {
    buffer_->activities.push_back(std::make_unique<libkineto::GenericTraceActivity>(buffer_->span, type, name));
    return *buffer_->activities.back();
  }

  SessionOptions options_;
  HostSampler sampler_;
  std::vector<DeviceActivity> tasks_;
  std::vector<HostSample> samples_;
  std::set<std::pair<int, int>> rows_;  // (device, stream) with tasks
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
};

class NeuronProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return activities_; }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& requested,
                                                                 const libkineto::Config& config) override {
    // A session that asks for no device activity costs nothing. (PyTorch asks
    // for the PrivateUse1 runtime types in CPU-only sessions too; kernels and
    // copies come only with ProfilerActivity.NEURON.)
    if (requested.count(ActivityType::CONCURRENT_KERNEL) || requested.count(ActivityType::GPU_MEMCPY))
      return std::make_unique<NeuronSession>(parse_session_options(config.getCustomConfig()));
    return nullptr;
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                 const std::set<ActivityType>& requested,
                                                                 const libkineto::Config& config) override {
    return configure(requested, config);
  }

 private:
  std::string name_ = "neuron";
  std::set<ActivityType> activities_ = {ActivityType::PRIVATEUSE1_RUNTIME, ActivityType::PRIVATEUSE1_DRIVER,
                                        ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY};
};

REGISTER_PRIVATEUSE1_PROFILER(NeuronProfiler);

} // namespace
} // namespace torchneuron::profiler
