// How a kernel's result reaches the device memory made for it.
#pragma once

#include <ATen/Tensor.h>

namespace torchneuron {

// `dst.copy_(src)` for host tensors of the same sizes, where `dst` (the
// result's memory, laid out as the CPU kernel's result) may be expanded: a
// composite returns a broadcast view where a CPU caller would get the view
// itself (convolution's double backward returns the bias gradient's
// gradient expanded to the output's shape). copy_ refuses a destination
// whose elements share memory, so dimensions of stride 0 on both sides,
// which hold one value each, are copied once.
void copy_result(at::Tensor dst, at::Tensor src);

} // namespace torchneuron
