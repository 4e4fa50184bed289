#include "torch_patches.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <mutex>

namespace torchneuron::torch_patches {

void replace_cpu_allocator(c10::Allocator* wrapper) {
  static std::once_flag once;
  std::call_once(once, [wrapper] {
    c10::SetCPUAllocator(wrapper, /*priority=*/1);
    TORCH_CHECK(c10::GetCPUAllocator() == wrapper,
                "torchneuron patch 'cpu-allocator': c10::SetCPUAllocator no longer replaces the CPU allocator "
                "(checked against PyTorch 2.13.0); results of functional kernels cannot be placed in device "
                "memory. See csrc/bridge/torch_patches.h.");
  });
}

} // namespace torchneuron::torch_patches
