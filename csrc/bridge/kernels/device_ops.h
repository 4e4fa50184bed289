// Operators the device can compute its own way instead of with ATen's CPU
// kernel: float32 tanh (tanh.h), when TORCHNEURON_DEVICE_TANH=1 selects it.
// exec/launch.h's call_kernel calls these for the operators whose policy
// names them (exec/op_policy.h), which it does only where they are selected.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace torchneuron::device_ops {

// tanh, tanh_ or tanh.out on `stack` (host views): true if it ran, with its
// result on the stack; false (nothing done) when these arguments are not
// float32, and ATen's kernel runs instead.
bool tanh(const c10::OperatorHandle& op, torch::jit::Stack* stack);

} // namespace torchneuron::device_ops
