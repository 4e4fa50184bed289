// What the first call of a call signature teaches the executor.
//
// The first call of each call signature (meta.h, call_signature) runs
// synchronously: the CPU kernel makes its own checks and decides its
// results' metadata. Compared with the meta pass's prediction for that call,
// its results give the verdict for every later call of the signature:
//
//   Queue           the prediction was the CPU's metadata: queue as predicted
//   QueueInLayouts  only strides differed (Python meta kernels order a
//                   result's dimensions otherwise than TensorIterator, or
//                   give size-1 dimensions other strides), and the CPU's
//                   results were dense: queue, with each such result laid out
//                   densely in the CPU's dimension order at the predicted sizes
//   Synchronous     dtypes, sizes or offsets differed, or a result was not
//                   dense: later calls run synchronously, where the CPU kernel
//                   decides
//
// A call signature holds what decides a result's layout (each tensor's
// dimension order and size-1, size-0 and broadcast dimensions), so one
// signature's results have one dimension order.
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include <memory>
#include <vector>

namespace torchneuron {

struct MetaResult;
struct OpPolicy;

// A dense layout's dimensions, outermost first.
using DimOrder = c10::SmallVector<int8_t, 6>;

struct CallVerdict {
  enum class Kind : uint8_t { Queue, QueueInLayouts, Synchronous };
  Kind kind = Kind::Queue;
  // QueueInLayouts: per fresh result tensor (the returns' tensors in order),
  // then per written argument; empty where the prediction holds.
  std::vector<DimOrder> result_orders, written_orders;
};

// The verdict of a first call: `results` are the call's returns (as
// run_synchronously leaves them), `written` its written arguments after it
// (policy.written order; undefined where not a tensor).
CallVerdict judge_first_call(const OpPolicy& policy, const MetaResult& predicted, c10::ArrayRef<c10::IValue> results,
                             const std::vector<at::Tensor>& written);

// `predicted` with the verdict's layouts (a QueueInLayouts verdict).
std::shared_ptr<const MetaResult> in_learned_layouts(const OpPolicy& policy, const MetaResult& predicted,
                                                     const CallVerdict& verdict);

} // namespace torchneuron
