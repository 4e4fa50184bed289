// How busy a device has been: the time during which at least one of its
// streams runs a task, kept per short interval for the last few seconds, so
// that utilization() answers as torch.cuda.utilization() does (the percent
// of the past sample period in which one or more kernels ran).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

namespace torchneuron::runtime {

class BusyTime {
 public:
  static constexpr int64_t kBucketNs = 10'000'000;        // 10 ms
  static constexpr int64_t kSamplePeriodNs = 1'000'000'000;  // what utilization() covers

  // A task starts or ends on one of the device's streams (steady-clock ns).
  void task_started(int64_t now_ns);
  void task_finished(int64_t now_ns);
  // Percent (0 to 100) of the sample period before `now_ns` during which a task ran.
  int utilization(int64_t now_ns);

 private:
  static constexpr size_t kBuckets = 2 * kSamplePeriodNs / kBucketNs;
  void add(int64_t from_ns, int64_t to_ns);  // with mu_ held
  int64_t busy_in(int64_t from_ns, int64_t to_ns) const;

  std::mutex mu_;
  int running_ = 0;        // tasks running now, over all streams
  int64_t busy_since_ = 0;  // when running_ last became positive
  struct Bucket {
    int64_t index = -1;  // which kBucketNs interval it holds
    int64_t busy_ns = 0;
  };
  std::array<Bucket, kBuckets> buckets_{};
};

} // namespace torchneuron::runtime
