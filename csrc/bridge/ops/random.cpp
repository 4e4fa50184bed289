// Random operators whose CPU kernels would draw from the CPU's generator (they
// take no Generator argument), written in terms of operators that do, so they
// draw from the device generator instead; random_(from, to), whose CPU
// kernel checks its range at every call; and calls that reach the device only
// through a `neuron` generator, which run as CUDA runs them.
#include <ATen/ATen.h>
#include <ATen/native/DistributionTemplates.h>
#include <c10/util/Exception.h>

#include <limits>

#include "../device_state.h"
#include "../exec/executor.h"
#include "../exec/host_views.h"
#include "explicit_ops.h"

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

namespace {

// The checks of ATen's random_from_to_impl (ATen/native/DistributionTemplates.h)
// ahead of its kernel: `from` below `to`, both within the dtype, and the
// warning for a floating-point range beyond the integers the dtype holds
// exactly. Nothing of them depends on the data.
void check_random_range(at::ScalarType dtype, int64_t from, std::optional<int64_t> to_opt) {
  using namespace at::native::templates;
  const auto meta = c10::scalarTypeToTypeMeta(dtype);
  if (to_opt) {
    int64_t to = *to_opt;
    TORCH_CHECK(from < to, "random_ expects 'from' to be less than 'to', but got from=", from, " >= to=", to);
    if (at::isFloatingType(dtype)) {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, dtype, "random_update_from_to", [&] {
        from = update_from<scalar_t>(from);
        to = update_to<scalar_t>(to);
        TORCH_CHECK(from < to, "random_ expects 'from' casted to dtype to be less than 'to' casted to dtype, but got from=",
                    from, " >= to=", to);
      });
    }
    check_from_to_in_range(from, to - 1, meta);
  } else if (from != std::numeric_limits<int64_t>::lowest()) {
    int64_t to_inc = 0;
    if (at::isFloatingType(dtype)) {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, dtype, "random_from_to_range_calc", [&] {
        constexpr int64_t scalar_t_max = static_cast<int64_t>(1) << std::numeric_limits<scalar_t>::digits;
        to_inc = scalar_t_max > std::numeric_limits<int64_t>::max() ? std::numeric_limits<int64_t>::max()
                                                                     : static_cast<int64_t>(scalar_t_max);
        from = update_from<scalar_t>(from);
        TORCH_CHECK(from < to_inc, "random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' casted ",
                    "to dtype, but got from=", from, " > to_inc=", to_inc);
      });
    } else if (at::isIntegralType(dtype, /*includeBool=*/true)) {
      AT_DISPATCH_V2(dtype, "random_from_to_range_calc", AT_WRAP([&] {
        if constexpr (std::is_same_v<scalar_t, bool>) {
          to_inc = static_cast<int64_t>(true);
        } else {
          to_inc = static_cast<int64_t>(std::numeric_limits<scalar_t>::max());
        }
      }), AT_EXPAND(AT_INTEGRAL_TYPES_V2), at::kBool);
    } else {
      TORCH_CHECK(false, "random_from_to_impl handles only integral, floating-point and boolean types");
    }
    check_from_to_in_range(from, to_inc, meta);
  }
}

struct DropWarnings final : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

// Whether a call came to `neuron` by its generator alone: a `neuron` generator
// among its arguments (a generator's dispatch key joins the call's, as a CUDA
// generator's does), and no `neuron` tensor or device.
bool only_the_generator_is_on_the_device(c10::ArrayRef<c10::IValue> args) {
  bool neuron_generator = false;
  for (const auto& a : args)
    if (a.isGenerator() && a.toGenerator().defined() && a.toGenerator().device().type() == kNeuron)
      neuron_generator = true;
  if (!neuron_generator) return false;
  bool on_device = false;
  for (const auto& a : args) {
    if (a.isDevice() && a.toDevice().type() == kNeuron) on_device = true;
    for_each_tensor(a, [&](const at::Tensor& t) { on_device |= t.defined() && t.device().type() == kNeuron; });
  }
  return !on_device;
}

} // namespace

void execute_unless_only_the_generator_is_on_the_device(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // torch.randn(n, generator=<a CUDA generator>) runs the CPU kernel, which
  // refuses the generator ("Expected a 'cpu' device type for generator but
  // found 'cuda'"); a `neuron` generator gets the same kernel and refusal.
  if (only_the_generator_is_on_the_device(torch::jit::last(*stack, op.schema().arguments().size())))
    return op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  execute(op, stack);
}

void random_range_checked(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // random_.from (self, from, to, generator) and random_.to (self, to, generator)
  const bool has_from = op.schema().overload_name() == "from";
  auto args = torch::jit::last(*stack, op.schema().arguments().size());
  const at::Tensor& self = args[0].toTensor();
  if (has_from) check_random_range(self.scalar_type(), args[1].toInt(), args[2].toOptional<int64_t>());
  else check_random_range(self.scalar_type(), 0, args[1].toInt());
  // The call's warnings were given above, at the call, once each; the
  // kernel's own checks repeat them wherever it runs.
  static DropWarnings drop;
  c10::WarningUtils::WarningHandlerGuard quiet(&drop);
  execute_unless_only_the_generator_is_on_the_device(op, stack);
}

} // namespace torchneuron::ops
