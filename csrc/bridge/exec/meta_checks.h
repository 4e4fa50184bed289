// Checks that CPU kernels make on their arguments' metadata and their meta
// kernels do not. The meta pass runs them (run_meta, OpPolicy::meta_check),
// so a call they refuse runs synchronously and raises the CPU kernel's own
// error at the call instead of at the next synchronisation.
#pragma once

#include <ATen/core/stack.h>

namespace torchneuron {

using MetaCheck = void (*)(const torch::jit::Stack& meta_args);

// index_put and its relatives (self, indices, values, ...): each mask's
// sizes against the dimensions it indexes, and the values against the
// indexed shape where no mask makes that shape depend on the data.
void check_index_put(const torch::jit::Stack& meta_args);

// multinomial (self, num_samples, replacement, ...): the number of samples
// against the categories.
void check_multinomial(const torch::jit::Stack& meta_args);

} // namespace torchneuron
