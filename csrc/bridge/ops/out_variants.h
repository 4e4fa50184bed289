// The out= overload of a functional operator (add.Tensor -> add.out), so a
// queued task can write results straight into the outputs allocated at launch
// instead of computing into fresh host memory and copying.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>

namespace torchneuron {

// For a structured operator, the overload that takes the same arguments plus
// one kwarg-only out tensor per return; nullopt otherwise.
std::optional<c10::OperatorHandle> out_variant_of(const c10::OperatorHandle& functional);

} // namespace torchneuron
