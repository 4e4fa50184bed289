// The executor's entry point: every ATen operator on `neuron` that has no
// explicit kernel (../ops/explicit_ops.h) runs through `execute` (executor.cpp
// says how), registered as the PrivateUse1 key's catch-all kernel (PyTorch's
// m.fallback; the synchronous fallback is one of the ways it runs an operator).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace torchneuron {

void execute(const c10::OperatorHandle& op, torch::jit::Stack* stack);

} // namespace torchneuron
