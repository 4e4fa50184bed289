// The out= overload of a functional operator (add.Tensor -> add.out), so a
// queued task can write results straight into the outputs allocated at launch
// instead of computing into fresh host memory and copying.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>

namespace torchneuron {

// The overload that takes the same arguments plus one kwarg-only out tensor
// per return, with a CPU kernel; nullopt if there is none.
std::optional<c10::OperatorHandle> out_variant_of(const c10::OperatorHandle& functional);

} // namespace torchneuron
