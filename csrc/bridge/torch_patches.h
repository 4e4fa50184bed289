// Every change torchneuron makes to PyTorch's C++ state beyond the
// extension points PyTorch offers a backend (device guard, hooks, allocator
// and kernel registration), in one place. Each patch says what it changes,
// why, the PyTorch version it was checked against, and checks when applied
// that its target still behaves as expected, raising an error that names
// the patch otherwise. The Python layer's patches are in
// torchneuron/_torch_patches.py.
#pragma once

#include <c10/core/Allocator.h>

namespace torchneuron::torch_patches {

// Patch "cpu-allocator". Replaces the process-wide CPU allocator with
// `wrapper`, which must forward every request to the allocator it wraps
// (the one c10::GetCPUAllocator() returned before) except those it serves
// itself. Why: functional CPU kernels without an out= overload allocate
// their results through it, and exec/result_placement.h answers those
// requests with the results' device memory while a device task runs the
// kernel, so the result needs no copy. Checked against PyTorch 2.13.0:
// c10::SetCPUAllocator(a, priority) makes GetCPUAllocator() return `a` when
// `priority` is at least that of the current allocator (the default one is
// registered with priority 0). Applied once; later calls do nothing.
void replace_cpu_allocator(c10::Allocator* wrapper);

} // namespace torchneuron::torch_patches
