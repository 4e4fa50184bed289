// Adaptive eager execution: element-wise operators queued behind busy device
// work (and a row-wise one closing the chain: softmax, layer norm, a sum or a
// max over the last dimension) are merged into one device task that walks
// memory once, in cache-sized pieces, applying every member to each piece.
//
// Results are bit-identical to unfused execution, by construction: each member
// runs the same CPU kernel, on the same thread ranges that kernel would use
// for the whole tensor (TensorIterator's split), cut into pieces that start
// where its vector loop would anyway, so each element takes the same (vector
// or scalar) code path. Operands are contiguous and cover the whole iteration
// space or broadcast over it as a row (a bias), a column (a row statistic) or
// one element. A group that broadcasts or has a row-wise member is cut into
// pieces of whole rows, which row-wise kernels compute row by row exactly as
// in one call; when threads would not start on a row, the members run one
// after another over everything, as unfused. Tensors in a group coincide or
// are disjoint, so no member reads an element another has not produced yet.
// An intermediate freed while the task still waits never reaches memory.
//
// "Adaptive": a call fuses only into a task still waiting in the queue, so
// fusion happens exactly when the host runs ahead of the device.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

#include "runtime/stream.h"

namespace torchneuron {

// One queued element-wise call, in the form a device task runs it.
struct ElementwiseCall {
  c10::OperatorHandle op;          // the overload to run (functional, out= or in-place)
  std::vector<c10::IValue> args;   // host aliases, scalars, out= outputs
  std::vector<at::Tensor> results; // functional without out=: where results go
  std::string name;                // the operator the user called
};

// Work smaller than this many elements gains nothing from fusing (its
// intermediates stay in cache anyway, and the pieces cost calls): callers skip
// building a call below it. 1M elements by default; tests lower it to reach
// the fusion logic with small tensors.
int64_t min_fusable_numel();
void set_min_fusable_numel(int64_t numel);

// On unless TORCHNEURON_ADAPTIVE_EAGER=0 or torch.use_deterministic_algorithms(True).
bool adaptive_eager_enabled();
void set_adaptive_eager(bool enabled);  // tests and benchmarks
// Element-wise operators, and row-wise ones (softmax, layer norm, a sum or a
// max over the last dimension) that can close a chain.
bool is_fusable(const c10::FunctionSchema& schema);

// Queues `call` on `stream`, merged into the pending fused task at the tail
// when it can be. Returns false, queuing nothing, if `call` cannot take part
// in fusion (the caller then queues it as a task of its own).
bool enqueue_fusable(runtime::Stream& stream, ElementwiseCall& call);

// Device memory [ptr, ptr + nbytes) was freed on `stream` by its last owner.
// If the pending fused task at the stream's tail produces that tensor, the
// tensor is an intermediate nobody holds: the task keeps it in cache-sized
// scratch and never writes it to memory.
void release_from_pending_group(runtime::Stream& stream, const void* ptr, size_t nbytes);

} // namespace torchneuron
