// Pinned host memory for `neuron`: what pin_memory(), is_pinned() and
// DataLoader(pin_memory=True) use, registered with PyTorch as the device's
// host allocator (torch.accelerator.empty_host_cache(), host memory
// statistics). Pinned buffers let host<->device copies with non_blocking=True
// run asynchronously, as on CUDA.
#pragma once

#include <ATen/core/CachingHostAllocator.h>

namespace torchneuron {

at::HostAllocator& pinned_host_allocator();
bool is_pinned(const void* ptr);

} // namespace torchneuron
