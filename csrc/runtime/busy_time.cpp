#include "busy_time.h"

#include <algorithm>

namespace torchneuron::runtime {

void BusyTime::task_started(int64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_++ == 0) busy_since_ = now_ns;
}

void BusyTime::task_finished(int64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  if (--running_ == 0) add(busy_since_, now_ns);
}

void BusyTime::add(int64_t from_ns, int64_t to_ns) {
  for (int64_t b = from_ns / kBucketNs; b * kBucketNs < to_ns; ++b) {
    Bucket& bucket = buckets_[static_cast<size_t>(b) % kBuckets];
    if (bucket.index != b) bucket = {b, 0};
    bucket.busy_ns += std::min(to_ns, (b + 1) * kBucketNs) - std::max(from_ns, b * kBucketNs);
  }
}

int64_t BusyTime::busy_in(int64_t from_ns, int64_t to_ns) const {
  int64_t busy = 0;
  for (int64_t b = from_ns / kBucketNs; b * kBucketNs < to_ns; ++b) {
    const Bucket& bucket = buckets_[static_cast<size_t>(b) % kBuckets];
    if (bucket.index != b) continue;
    // A bucket the period cuts counts in proportion.
    const int64_t overlap = std::min(to_ns, (b + 1) * kBucketNs) - std::max(from_ns, b * kBucketNs);
    busy += bucket.busy_ns * overlap / kBucketNs;
  }
  return busy;
}

int BusyTime::utilization(int64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t from = now_ns - kSamplePeriodNs;
  int64_t busy = busy_in(from, now_ns);
  if (running_ > 0) busy += now_ns - std::max(from, busy_since_);
  return static_cast<int>(std::clamp<int64_t>(busy * 100 / kSamplePeriodNs, 0, 100));
}

} // namespace torchneuron::runtime
