// Pinned host memory for `neuron`: what pin_memory(), is_pinned() and
// DataLoader(pin_memory=True) use. Pinned buffers let host<->device copies
// with non_blocking=True run asynchronously, as on CUDA.
#pragma once

#include <c10/core/Allocator.h>

namespace torchneuron {

c10::Allocator& pinned_host_allocator();
bool is_pinned(const void* ptr);

} // namespace torchneuron
