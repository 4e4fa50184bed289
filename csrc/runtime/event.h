// A marker in a stream. Recording places it after the work queued so far; the
// event completes when the stream reaches it, with a device-side timestamp.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace torchneuron::runtime {

class Stream;

class Event {
 public:
  explicit Event(bool enable_timing = false) : timing_(enable_timing) {}

  void record(Stream& stream);
  // Makes `stream` wait, on the device, until this event completes. Waiting
  // for an event that was never recorded does nothing (as on CUDA).
  void block(Stream& stream) const;
  bool query() const;
  // Waits on the host, then raises a pending error of the event's device.
  void synchronize() const;
  // Milliseconds between this event and `end`; both recorded with timing.
  double elapsed_ms(const Event& end) const;

  bool recorded() const { return marker_ != nullptr; }
  Stream* stream() const { return marker_ ? marker_->stream : nullptr; }

 private:
  struct Marker {
    Stream* stream;
    uint64_t seq = 0;
    std::atomic<int64_t> time_ns{0};
  };
  bool timing_;
  std::shared_ptr<Marker> marker_;  // a new one per record: earlier waits keep theirs
};

} // namespace torchneuron::runtime
