// The stream sanitizer's log (stream_sanitizer.h).
#include "stream_sanitizer.h"

#include <mutex>
#include <utility>

namespace torchneuron::sanitizer {

std::atomic<bool> logging{false};

namespace {
std::mutex mu;
std::vector<Record> records;
} // namespace

void append(Record r) {
  std::lock_guard<std::mutex> lock(mu);
  if (logging.load(std::memory_order_relaxed)) records.push_back(std::move(r));
}

std::vector<Record> drain() {
  std::lock_guard<std::mutex> lock(mu);
  return std::exchange(records, {});
}

void set_on(bool enabled) {
  std::lock_guard<std::mutex> lock(mu);
  logging.store(enabled, std::memory_order_relaxed);
  if (!enabled) records.clear();
}

} // namespace torchneuron::sanitizer
