// Device tasks as a profiler sees them: while recording, every task the
// runtime runs is kept with its launcher (the operator that queued it and
// the host thread), its queue, start and end times, on the profiler's clock.
// The Kineto session (kineto_profiler.cpp) is the client.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

} // namespace torchneuron::profiler
