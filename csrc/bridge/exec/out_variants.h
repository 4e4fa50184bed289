// The out= overload of a functional operator (add.Tensor -> add.out), so a
// queued task can write results straight into the outputs allocated at launch
// instead of computing into fresh host memory and copying.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <ATen/core/ivalue.h>

#include <optional>
#include <vector>

namespace torchneuron {

// For a structured operator, the overload that takes the same arguments plus
// one kwarg-only out tensor per return; nullopt otherwise.
std::optional<c10::OperatorHandle> out_variant_of(const c10::OperatorHandle& functional);

// A functional operator without a structured out= overload whose CPU kernel
// is, in ATen, a plain call of another operator's structured kernel: relu is
// clamp_min(self, 0). A queued task then writes straight into its output with
// that out= overload (plus `extra_args` after the operator's own arguments)
// instead of computing into fresh host memory and copying: on tiny tensors the
// allocation and the copy cost more than the kernel.
struct EquivalentOutCall {
  c10::OperatorHandle out_op;
  std::vector<c10::IValue> extra_args;
  // The functional kernel's own argument check, which the equivalent call
  // would not make (relu refuses bool inputs): where it would fail, the
  // functional kernel runs and reports its own error.
  bool (*applies)(c10::ArrayRef<c10::IValue> args);
};
std::optional<EquivalentOutCall> equivalent_out_call(const c10::OperatorHandle& functional);

} // namespace torchneuron
