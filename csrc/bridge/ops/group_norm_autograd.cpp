// GroupNorm's backward computed as the CPU computes it.
//
// PyTorch's derivative of native_group_norm (the generated
// NativeGroupNormBackward0) branches on the device: on the CPU it calls
// native_group_norm_backward with the gradient and the input in the input's
// suggested memory format, on every other device except XPU with both made
// contiguous. The CPU kernel has a channels-last algorithm of its own, which
// sums in a different order from the contiguous one, so on `neuron` a
// channels-last input got gradients that differ in their last bits from the
// CPU's, and an input gradient in the contiguous format.
//
// aten::group_norm (the composite nn.GroupNorm and F.group_norm call) is
// registered here for the autograd key. It runs the composite unchanged, so
// the forward, its checks, forward-mode AD and saved-tensor hooks are all
// PyTorch's own, and then replaces the backward node of its result with
// `GroupNormBackward`: a NativeGroupNormBackward0 (the same saved values, the
// same name and Python class) whose first-order backward takes the CPU's
// branch. The double-differentiable branch (create_graph, or gradients of the
// mean and rstd) is a device-independent composite and stays the generated
// one. Calls of native_group_norm itself keep the generated node; so does
// compiled autograd, which traces the generated formula.
#include <ATen/ATen.h>
#include <ATen/ops/group_norm_native.h>
#include <torch/csrc/autograd/generated/Functions.h>
#include <torch/library.h>

#include "explicit_ops.h"

namespace torchneuron::ops {
namespace {

using torch::autograd::variable_list;
using torch::autograd::generated::NativeGroupNormBackward0;

struct GroupNormBackward final : NativeGroupNormBackward0 {
  // Takes over `stock`'s saved values, edges, output metadata and sequence
  // number (which the profiler uses to pair it with its forward operator).
  explicit GroupNormBackward(NativeGroupNormBackward0& stock)
      : NativeGroupNormBackward0(stock.sequence_nr(), torch::autograd::edge_list(stock.next_edges())) {
    C = stock.C;
    HxW = stock.HxW;
    N = stock.N;
    eps = stock.eps;
    group = stock.group;
    input_ = std::move(stock.input_);
    weight_ = std::move(stock.weight_);
    result1_ = std::move(stock.result1_);
    result2_ = std::move(stock.result2_);
    for (uint32_t i = 0; i < stock.num_inputs(); ++i) input_metadata_.push_back(stock.input_metadata(i));
  }

  variable_list apply(variable_list&& grads) override {
    if (at::GradMode::is_enabled() || grads[1].defined() || grads[2].defined())
      return NativeGroupNormBackward0::apply(std::move(grads));
    std::lock_guard<std::mutex> lock(mutex_);
    variable_list grad_inputs(3);
    const std::array<bool, 3> mask{task_should_compute_output(0), task_should_compute_output(1),
                                   task_should_compute_output(2)};
    if (!grads[0].defined() || !(mask[0] || mask[1] || mask[2])) return grad_inputs;
    const at::Tensor input = input_.unpack();
    const at::Tensor weight = weight_.unpack();
    const at::Tensor mean = result1_.unpack(getptr());
    const at::Tensor rstd = result2_.unpack(getptr());
    // The CPU's branch of the generated formula: both in the input's format.
    const auto format = input.suggest_memory_format();
    auto [dx, dweight, dbias] = at::native_group_norm_backward_symint(
        grads[0].contiguous(format), input.contiguous(format), mean, rstd, weight, N, C, HxW, group, mask);
    if (mask[0]) grad_inputs[0] = std::move(dx);
    if (mask[1]) grad_inputs[1] = std::move(dweight);
    if (mask[2]) grad_inputs[2] = std::move(dbias);
    return grad_inputs;
  }
};

at::Tensor group_norm(const at::Tensor& input, int64_t num_groups, const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias, double eps, bool cudnn_enabled) {
  at::Tensor y = at::native::group_norm(input, num_groups, weight, bias, eps, cudnn_enabled);
  // The composite returns native_group_norm's first result as it is.
  const torch::autograd::Edge edge = torch::autograd::impl::gradient_edge(y);
  auto* stock = dynamic_cast<NativeGroupNormBackward0*>(edge.function.get());
  if (!stock || typeid(*stock) != typeid(NativeGroupNormBackward0) || edge.input_nr != 0) return y;
  torch::autograd::impl::set_gradient_edge(y, {c10::make_intrusive<GroupNormBackward>(*stock), 0});
  return y;
}

} // namespace

const std::type_info& group_norm_backward_node_type() { return typeid(GroupNormBackward); }

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { m.impl("group_norm", group_norm); }

} // namespace torchneuron::ops
