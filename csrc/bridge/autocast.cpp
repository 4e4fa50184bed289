// torch.autocast(device_type="neuron"): the casting lists PyTorch uses for
// CUDA (ATen/autocast_mode.h), registered for AutocastPrivateUse1.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

using at::Tensor;
using c10::IntArrayRef;
using c10::Scalar;
using c10::ScalarType;
using c10::string_view;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define NEURON_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NEURON_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NEURON_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NEURON_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(NEURON_LOWER)
  AT_FORALL_FP32(NEURON_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NEURON_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(NEURON_PROMOTE)
#undef NEURON_LOWER
#undef NEURON_FP32
#undef NEURON_FP32_SET_OPT_DTYPE
#undef NEURON_PROMOTE
}

} // namespace
} // namespace torchneuron
