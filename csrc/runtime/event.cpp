#include "event.h"

#include "device.h"
#include "errors.h"
#include "stream.h"

namespace torchneuron::runtime {

void Event::record(Stream& stream) {
  auto marker = std::make_shared<Marker>();
  marker->stream = &stream;
  // The marker is a task of its own so that its timestamp is taken on the
  // device, when everything before it has run.
  marker->seq = stream.enqueue("event_record", [marker] {
    marker->time_ns.store(now_ns(), std::memory_order_release);
  });
  marker_ = std::move(marker);
}

void Event::block(Stream& stream) const {
  if (!marker_ || marker_->stream == &stream) return;  // in-order already
  auto marker = marker_;
  stream.enqueue("event_wait", [marker] { marker->stream->wait_until(marker->seq); });
}

bool Event::query() const {
  return !marker_ || marker_->stream->is_complete(marker_->seq);
}

void Event::synchronize() const {
  if (!marker_) return;
  marker_->stream->wait_until(marker_->seq);
  marker_->stream->device().raise_pending_error();
}

double Event::elapsed_ms(const Event& end) const {
  if (!timing_ || !end.timing_)
    throw UsageError("elapsed_time needs both events created with enable_timing=True");
  if (!marker_ || !end.marker_)
    throw UsageError("elapsed_time needs both events to be recorded first");
  if (!query() || !end.query())
    throw UsageError("elapsed_time needs both events to have completed; synchronize first");
  return static_cast<double>(end.marker_->time_ns.load() - marker_->time_ns.load()) / 1e6;
}

} // namespace torchneuron::runtime
