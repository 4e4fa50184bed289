#include "result_copy.h"

#include <ATen/MemoryOverlap.h>

namespace torchneuron {

void copy_result(at::Tensor dst, at::Tensor src) {
  if (dst.sizes() == src.sizes() && at::has_internal_overlap(dst) == at::MemOverlap::Yes)
    for (int64_t d = 0; d < dst.dim(); ++d)
      if (dst.stride(d) == 0 && src.stride(d) == 0 && dst.size(d) > 1) {
        dst = dst.narrow(d, 0, 1);
        src = src.narrow(d, 0, 1);
      }
  dst.copy_(src);
}

} // namespace torchneuron
