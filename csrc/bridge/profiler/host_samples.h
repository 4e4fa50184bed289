// The host as a profiling session sees it: a thread that, while the session
// records, reads the kernel's counters (/proc) at a fixed period, so the trace
// can show host CPU utilisation and host memory next to the device's work
// (TorchNeuron's ProfileMode.CPU_UTIL and HOST_MEMORY). Reading /proc costs a
// few system calls per period; nothing is sampled unless a session asks.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace torchneuron::profiler {

struct HostSample {
  int64_t time_ns = 0;  // since the Unix epoch, the clock of the trace's host events
  // CPU: shares (0 to 1) of the period since the previous sample with CPU
  // figures; absent in the first sample, which only sets the baseline, and
  // when too few clock ticks passed to tell.
  bool has_cpu = false;
  double cpu_busy = 0;              // all CPUs of the host
  std::vector<double> cpu_busy_per_cpu;
  double process_cpus = 0;          // this process's CPU time over the period's wall time (1 = one CPU)
  // Memory, bytes (0 when not sampled).
  int64_t mem_total = 0, mem_available = 0, process_rss = 0;
};

class HostSampler {
 public:
  // Samples once at once and then every `period_ns` until stop().
  void start(bool cpu, bool memory, int64_t period_ns);
  // Takes a last sample, stops the thread and hands over the samples.
  std::vector<HostSample> stop();
  ~HostSampler();

 private:
  void sample();
  void run(int64_t period_ns);

  bool cpu_ = false, memory_ = false;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
  std::vector<HostSample> samples_;
  // The previous reading, for the shares over each period.
  std::vector<uint64_t> prev_busy_, prev_total_;  // index 0: all CPUs, then one per CPU
  int64_t prev_process_ns_ = 0;
  int64_t prev_time_ns_ = 0;
};

} // namespace torchneuron::profiler
