// The executor's entry point: every ATen operator on `neuron` that has no
// explicit kernel (../ops/explicit_ops.h) runs through `execute` (executor.cpp
// says how), registered as the PrivateUse1 boxed fallback.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace torchneuron {

void execute(const c10::OperatorHandle& op, torch::jit::Stack* stack);

} // namespace torchneuron
