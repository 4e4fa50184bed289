// Random operators whose CPU kernels would draw from the CPU's generator (they
// take no Generator argument). Written in terms of operators that do, so they
// draw from the device generator instead.
#include <ATen/ATen.h>

#include "kernels.h"

namespace torchneuron::ops {

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (input.numel() == 0) return {input.clone(), at::empty_like(input, input.options().dtype(at::kBool))};
  if (train.has_value() && !*train) return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  const double keep = 1. - p;
  const double scale = keep == 0 ? 0. : 1. / keep;
  at::Tensor mask = at::empty_like(input, at::MemoryFormat::Contiguous).bernoulli_(keep);
  at::Tensor output = input.mul(mask).mul_(scale);
  return {output, mask.to(at::kBool)};
}

} // namespace torchneuron::ops
