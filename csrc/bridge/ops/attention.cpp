// Scaled dot-product attention chooses its kernel as the CPU does.
//
// F.scaled_dot_product_attention asks a per-device dispatch stub which fused
// kernel to run; a device without an entry gets the math decomposition,
// which rounds differently from the CPU's flash kernel (and ignores
// torch.nn.attention.sdpa_kernel). The device's entry is the CPU's own choice:
// its selection reads only the inputs' metadata and the global backend
// flags, so it runs on `neuron` tensors as they are, and the kernel it picks
// (_scaled_dot_product_flash_attention_for_cpu and its backward) then runs
// on device memory through the executor, bit for bit the CPU's.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_ops.h>

namespace at::native {
namespace {

int64_t cpu_sdp_choice(const Tensor& query, const Tensor& key, const Tensor& value,
                       const std::optional<Tensor>& attn_mask, double dropout_p, bool is_causal,
                       std::optional<double> scale, bool enable_gqa) {
  return at::_ops::_fused_sdp_choice::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), query, key, value,
                                                 attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

} // namespace

REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &cpu_sdp_choice)

} // namespace at::native
