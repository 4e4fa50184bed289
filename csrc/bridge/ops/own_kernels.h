// Operators the device computes its own way instead of with ATen's CPU
// kernel: float32 tanh (../math/tanh.h). Every place that runs kernels on
// host aliases calls through here (the executor's tasks, fused groups'
// members, compiled replay), so an operator gives the same bits wherever
// and however it runs.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace torchneuron::ops {

// Runs `op` on `stack` (host aliases): the device's own kernel if it has one
// for these arguments, else ATen's CPU kernel.
void call_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

} // namespace torchneuron::ops
