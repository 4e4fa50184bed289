// What the stream sanitizer (torchneuron/sanitizers/stream.py) cannot see from a
// dispatch mode: synchronisations through the device guard and the device
// module (event record, wait, synchronize and destroy; stream and device
// synchronize), frees of device memory, and the stream a collective of the
// distributed backend runs on, with the orders it makes (as events), each
// with its device and stream.
// They are appended, in order, to a log that the sanitizer drains before it
// looks at the next operator. Off (the default), a hook costs one relaxed
// atomic load.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace torchneuron::sanitizer {

enum class Kind : uint8_t {
  EventRecord,        // `ptr`: the event; `stream`: where it was recorded
  EventWait,          // `stream` waits for event `ptr`
  EventSynchronize,   // the host waited for event `ptr`
  EventDestroy,
  StreamSynchronize,  // the host waited for `stream`
  DeviceSynchronize,  // the host waited for every stream of `device`
  Free,               // block [ptr, ptr + size) of `stream`'s pool lost its owner;
                      // `used_on`: the streams record_stream added
  Collective,         // the distributed backend queued a collective on `stream`
};

struct Record {
  Kind kind;
  int device = 0;
  int stream = 0;
  uintptr_t ptr = 0;
  size_t size = 0;
  std::vector<int> used_on;
};

extern std::atomic<bool> logging;
inline bool on() { return logging.load(std::memory_order_relaxed); }

void append(Record r);
// Takes everything logged so far; turning the log off clears it.
std::vector<Record> drain();
void set_on(bool enabled);

inline void log(Kind kind, int device, int stream, const void* ptr = nullptr) {
  if (on()) append({kind, device, stream, reinterpret_cast<uintptr_t>(ptr), 0, {}});
}
// `waiter` is ordered after everything queued on `stream` so far, as by an
// event recorded there that `waiter` waits for (waiter -1: the host waited).
inline void log_order(int device, int stream, int waiter, const void* token) {
  if (!on()) return;
  append({Kind::EventRecord, device, stream, reinterpret_cast<uintptr_t>(token), 0, {}});
  if (waiter >= 0) append({Kind::EventWait, device, waiter, reinterpret_cast<uintptr_t>(token), 0, {}});
  else append({Kind::EventSynchronize, device, 0, reinterpret_cast<uintptr_t>(token), 0, {}});
  append({Kind::EventDestroy, device, 0, reinterpret_cast<uintptr_t>(token), 0, {}});
}
inline void log_free(int device, int stream, const void* ptr, size_t size, const std::vector<int>& used_on) {
  if (on()) append({Kind::Free, device, stream, reinterpret_cast<uintptr_t>(ptr), size, used_on});
}

} // namespace torchneuron::sanitizer
