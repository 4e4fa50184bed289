// Where queued work meets adaptive eager execution (../fusion/): the form in
// which the executor offers an element-wise call, the switches that say
// when it offers one, and the fuser's registration. The fuser depends on the
// executor, never the reverse: it installs itself when the extension loads.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

#include "runtime/stream.h"

namespace torchneuron {

struct OpPolicy;

// One queued element-wise call, in the form a device task runs it.
struct ElementwiseCall {
  c10::OperatorHandle op;          // the overload to run (functional, out= or in-place)
  std::vector<c10::IValue> args;   // host views, scalars, out= outputs
  std::vector<at::Tensor> results; // functional without out=: where results go
  const OpPolicy* policy;          // of the operator the user called
};

// Callers offer the fuser calls of this many elements and more; whether one
// joins a group, and how a group is cut, is the fuser's cost model's to say
// (../fusion/cost_model.h). Smaller work takes the lean host path
// (../ops/lean_path.cpp): below ATen's grain size a kernel runs on one thread
// and its host cost is what bounds it. Settable upwards (benchmarks compare
// sizes); never below kFusionFloor.
constexpr int64_t kFusionFloor = 1 << 15;
int64_t min_fusable_numel();
void set_min_fusable_numel(int64_t numel);

// On unless TORCHNEURON_ADAPTIVE_EAGER=0 or torch.use_deterministic_algorithms(True).
bool adaptive_eager_enabled();
void set_adaptive_eager(bool enabled);  // tests and benchmarks

// Queues `call` on `stream` through the fuser, merged into pending work when
// it can be. Returns false, queuing nothing, if there is no fuser or `call`
// cannot take part in fusion (the caller then queues it as a task of its own).
using Fuser = bool (*)(runtime::Stream& stream, ElementwiseCall& call);
bool offer_to_fuser(runtime::Stream& stream, ElementwiseCall& call);
void install_fuser(Fuser fuser);

} // namespace torchneuron
