// ATen's own C++ meta kernels, for the meta pass (meta.h).
//
// At import, torch._meta_registrations registers Python functions (mostly
// torch._refs, through prims) as the Meta kernels of most ATen operators,
// in place of the C++ meta functions ATen's structured kernels are built
// on. Those Python kernels cost tens of microseconds a call, paid at every
// new shape signature (a generated token, a batch of another length), and
// they need not lay out results as the CPU kernel does. The CPU kernel of a
// structured operator runs the C++ meta function itself, so calling that
// function (at::meta::*, which ATen's codegen exports) predicts exactly the
// metadata and the checks of the CPU kernel the task will run.
#pragma once

#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <string>
#include <vector>

namespace torchneuron {

// ATen's C++ meta kernel of `op`, called boxed with the meta pass's stack,
// for the operators listed in aten_meta.cpp; null for every other.
const c10::KernelFunction* aten_meta_kernel(const c10::OperatorHandle& op);

// The operators listed ("aten::add.Tensor", ...), for the test that each is
// one whose Meta kernel Python has taken over.
std::vector<std::string> aten_meta_operators();

} // namespace torchneuron
