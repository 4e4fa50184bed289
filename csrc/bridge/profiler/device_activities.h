// Device tasks as a profiler sees them: while recording, every task the
// runtime runs is kept with its launcher (the operator that queued it and
// the host thread), its queue, start and end times, on the profiler's clock.
// The Kineto session (kineto_profiler.cpp) is the client.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "host_samples.h"

namespace torchneuron::profiler {

struct DeviceActivity {
  std::string name;      // the task's name: "aten::mm", "fused:aten::mul.Tensor+aten::add.Tensor", ...
  int device = 0;
  int stream = 0;
  uint64_t launcher_tag = 0;  // the profiler's correlation id of the launching operator (0: none)
  int32_t launcher_thread = 0;  // system thread id of the launching host thread
  // Nanoseconds since the Unix epoch, as PyTorch's profiler timestamps host events.
  int64_t queued_ns = 0, start_ns = 0, end_ns = 0;
};

// Starts keeping every device task that finishes from now on; the runtime
// records launchers only meanwhile, so an idle profiler costs nothing.
void start_recording();
// Stops and hands over what was kept, in order of completion.
std::vector<DeviceActivity> stop_recording();

// The calling thread's operator correlation id (the Kineto session's push
// and pop), recorded in the tasks it launches.
void push_launch_tag(uint64_t tag);
void pop_launch_tag();

// What a session is asked for beyond the tasks, read from the profiler's custom
// config (ExperimentalConfig.custom_profiler_config, which
// torch_neuronx.profiling.NeuronConfig writes): `key:value` items separated by
// ';'. Keys of other consumers (profile_output_dir, modes) are left alone; a
// config that is not such a list (another backend's JSON) applies nothing.
struct SessionOptions {
  std::optional<std::set<int>> cores;  // capture_enabled_for_nc ("0,1,2-5"); none: every core
  uint64_t max_events_per_core = 0;    // max_events_per_nc; 0: no limit
  bool cpu_util = false;               // sample the host's CPU utilisation while recording
  bool host_memory = false;            // sample the host's memory while recording
  std::vector<std::string> problems;   // items of ours whose value could not be read
};
SessionOptions parse_session_options(const std::string& custom_config);

// What the last processed session put into its trace and what it left out,
// for the Python side (torch_neuronx.profiling) to report and write.
struct SessionReport {
  bool valid = false;                  // a session has been processed
  std::map<int, uint64_t> kept;        // device tasks in the trace, per core
  std::map<int, uint64_t> dropped;     // oldest tasks left out by max_events_per_nc, per core
  uint64_t other_cores = 0;            // tasks of cores outside capture_enabled_for_nc
  bool cpu_util = false, host_memory = false;
  std::vector<HostSample> samples;     // inside the capture window
  std::vector<std::string> problems;
};
SessionReport last_session_report();
void set_last_session_report(SessionReport report);

} // namespace torchneuron::profiler
