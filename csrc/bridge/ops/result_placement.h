// Functional CPU kernels without an out= overload (layer norm, convolution,
// embedding backward, ...) allocate their results with the CPU allocator, and
// a device task would then copy each result into the device tensor the host
// already handed out. While a task runs such a kernel, `PlaceResults` makes the
// CPU allocator answer the first request of each result's exact size with that
// result's device memory, so the kernel computes in place and the copy is
// skipped (`settle_results`). A kernel that allocates differently (a scratch
// buffer of the same size first, another layout) still gets the right answer:
// whatever is not in place is copied, through a clone if it sits in placed
// memory.
//
// Only for kernels known to allocate with at::empty: a kernel that takes raw
// CPU memory (oneDNN's convolution does) could keep placed memory past the
// task, so it is never offered any (`places_results`).
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace torchneuron {

bool places_results(const std::string& op_name);

class PlaceResults {
 public:
  // `outputs`: device-memory host aliases (Tensor or Tensor[] values); nothing
  // is placed unless `enabled`.
  PlaceResults(const std::vector<c10::IValue>& outputs, bool enabled);
  ~PlaceResults();
  PlaceResults(const PlaceResults&) = delete;
  PlaceResults& operator=(const PlaceResults&) = delete;
};

// Copies each kernel result `results[i]` into `outputs[i]` unless it is
// already there.
void settle_results(const std::vector<c10::IValue>& results, const std::vector<c10::IValue>& outputs);

} // namespace torchneuron
