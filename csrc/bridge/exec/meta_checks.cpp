#include "meta_checks.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>

namespace torchneuron {

void check_index_put(const torch::jit::Stack& meta_args) {
  const at::Tensor& self = meta_args[0].toTensor();
  const auto indices = meta_args[1].toOptionalTensorList();
  const at::Tensor& values = meta_args[2].toTensor();
  bool masked = false;
  int64_t dim = 0;  // the dimension of self the next index starts at
  for (const std::optional<at::Tensor>& index : indices) {
    if (!index || !index->defined() || (index->scalar_type() != at::kBool && index->scalar_type() != at::kByte)) {
      ++dim;
      continue;
    }
    for (int64_t j = 0; j < index->dim(); ++j)
      TORCH_CHECK_INDEX(index->size(j) == self.size(dim + j), "The shape of the mask ", index->sizes(), " at index ",
                        j, " does not match the shape of the indexed tensor ", self.sizes(), " at index ", dim + j);
    dim += index->dim();
    masked = true;
  }
  if (masked) return;  // the indexed shape counts the mask's selected elements
  const at::Tensor indexed = at::index(self, indices);
  TORCH_CHECK(at::is_expandable_to(values.sizes(), indexed.sizes()), "shape mismatch: value tensor of shape ",
              values.sizes(), " cannot be broadcast to indexing result of shape ", indexed.sizes());
}

void check_multinomial(const torch::jit::Stack& meta_args) {
  const at::Tensor& self = meta_args[0].toTensor();
  const int64_t n = meta_args[1].toInt();
  TORCH_CHECK(n > 0, "cannot sample n_sample <= 0 samples");
  TORCH_CHECK(meta_args[2].toBool() || self.dim() == 0 || n <= self.size(-1),
              "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
}

} // namespace torchneuron
