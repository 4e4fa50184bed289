#include "host_samples.h"

#include <unistd.h>

#include <time.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

namespace torchneuron::profiler {
namespace {

int64_t unix_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// /proc/stat's "cpu" lines: (busy, total) jiffies, the host's first, then one per CPU.
void read_cpu_times(std::vector<uint64_t>& busy, std::vector<uint64_t>& total) {
  busy.clear();
  total.clear();
  std::ifstream in("/proc/stat");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu", 0) != 0) break;  // the cpu lines come first
    std::istringstream fields(line);
    std::string name;
    fields >> name;
    uint64_t value = 0, sum = 0, idle = 0;
    for (int i = 0; fields >> value; ++i) {
      // user nice system idle iowait irq softirq steal guest guest_nice: guest
      // time is already counted in user and nice.
      if (i >= 8) break;
      sum += value;
      if (i == 3 || i == 4) idle += value;
    }
    busy.push_back(sum - idle);
    total.push_back(sum);
  }
}

// CPU time of this process (every thread), nanoseconds.
int64_t process_cpu_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

void read_memory(HostSample& s) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemTotal:") s.mem_total = kib * 1024;
    if (key == "MemAvailable:") s.mem_available = kib * 1024;
  }
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (statm >> size >> resident) s.process_rss = resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

double share(uint64_t part, uint64_t whole) { return whole ? static_cast<double>(part) / whole : 0.0; }

} // namespace

void HostSampler::sample() {
  HostSample s;
  s.time_ns = unix_now_ns();
  if (cpu_) {
    std::vector<uint64_t> busy, total;
    read_cpu_times(busy, total);
    const int64_t process_ns = process_cpu_ns();
    const bool baseline = prev_total_.empty() || prev_total_.size() != total.size();
    // /proc/stat counts in clock ticks: a share over fewer than two ticks per CPU
    // says little, so such a period is extended into the next one.
    const uint64_t cpus = total.size() > 1 ? total.size() - 1 : 1;
    if (!baseline && total[0] - prev_total_[0] >= 2 * cpus && s.time_ns > prev_time_ns_) {
      s.has_cpu = true;
      s.cpu_busy = share(busy[0] - prev_busy_[0], total[0] - prev_total_[0]);
      for (size_t i = 1; i < total.size(); ++i)
        s.cpu_busy_per_cpu.push_back(share(busy[i] - prev_busy_[i], total[i] - prev_total_[i]));
      s.process_cpus =
          static_cast<double>(process_ns - prev_process_ns_) / static_cast<double>(s.time_ns - prev_time_ns_);
    }
    if (baseline || s.has_cpu) {
      prev_busy_ = std::move(busy);
      prev_total_ = std::move(total);
      prev_process_ns_ = process_ns;
      prev_time_ns_ = s.time_ns;
    }
  }
  if (memory_) read_memory(s);
  std::lock_guard<std::mutex> lock(mu_);
  samples_.push_back(std::move(s));
}

void HostSampler::run(int64_t period_ns) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!wake_.wait_for(lock, std::chrono::nanoseconds(period_ns), [&] { return stopping_; })) {
    lock.unlock();
    sample();
    lock.lock();
  }
}

void HostSampler::start(bool cpu, bool memory, int64_t period_ns) {
  stop();
  cpu_ = cpu;
  memory_ = memory;
  {
    std::lock_guard<std::mutex> lock(mu_);
    samples_.clear();
    stopping_ = false;
  }
  prev_busy_.clear();
  prev_total_.clear();
  if (!cpu_ && !memory_) return;
  sample();
  thread_ = std::thread([this, period_ns] { run(period_ns); });
}

std::vector<HostSample> HostSampler::stop() {
  if (!thread_.joinable()) {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(samples_);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  sample();
  std::lock_guard<std::mutex> lock(mu_);
  return std::move(samples_);
}

HostSampler::~HostSampler() {
  if (thread_.joinable()) stop();
}

} // namespace torchneuron::profiler
