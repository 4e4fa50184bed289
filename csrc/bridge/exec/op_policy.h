// How each operator runs on `neuron`: one policy per operator, the one place
// every part of the bridge asks.
//
// A policy is computed once per operator, at its first call, from two
// sources: its schema (which arguments it writes, which results alias which
// arguments, its generators) and the rule table in op_policy.cpp (everything
// a schema does not say). The questions it answers:
//
//   view             returns aliases of its inputs and writes nothing: metadata only
//   data_dependent   its output sizes depend on input values: it waits for the stream
//   host_indices     takes index tensors on the host (as CUDA allows)
//   device_only_arg  an argument that is never a CPU scalar operand (as CUDA refuses it)
//   fusion           element-wise (may join a fused group) or row-wise (may close one)
//   exact            fusion may compute it in its own loops (kernels/exact_arithmetic.h)
//   place_results    its CPU kernel may compute straight into device memory
//   out_op           the out= overload its task calls, or another operator's
//                    out= that computes the same (equivalent_out)
//   device_op        the device's own kernel replaces ATen's (kernels/device_ops.h), where
//                    selected (float32 tanh: TORCHNEURON_DEVICE_TANH=1, kernels/tanh.h)
//   unsupported_result  returns a quantized or sparse tensor: refused at the call
//   has_meta_kernel  whether a meta pass can predict its results at all
//
// Operators with explicit kernels (the lean path, storage, copies) are the
// ones ops/register.cpp registers; everything else reaches exec/executor.h.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "../sanitizers/op_tracking.h"
#include "meta_checks.h"
#include "out_variants.h"

namespace torchneuron {

class PlacementHistory;
struct CallVerdict;

enum class Fusion : uint8_t { None, Elementwise, Rowwise };

// How fusion's own loops compute an operator bit for bit as ATen does.
enum class ExactKind : uint8_t {
  None, Add, Sub, Mul, Div, Neg, Abs, Clamp, Reciprocal,
  Function,  // a math-library function ATen calls (kernels/vector_math.h)
};

enum class DeviceOp : uint8_t { None, Tanh };

struct OpPolicy {
  // From the schema.
  std::vector<size_t> written;       // arguments the op writes (Tensor(a!))
  std::vector<int> source;           // per return: the argument it aliases, or -1
  std::vector<size_t> generators;    // Generator? arguments
  std::vector<bool> is_tensor_list;  // per argument: Tensor[] or Tensor?[]
  bool view = false;
  bool tensor_returns = true;        // every return is a tensor (or a list of them)
  // Output metadata cannot depend on a floating-point argument's value: the
  // op returns nothing, or only `self`, updated in place. Such values (a
  // learning rate, AdamW's bias corrections) then stay out of the meta
  // cache's key, so a value that changes every step does not rerun the meta
  // kernel every step.
  bool float_values_free = false;
  // Several tensor results: some meta kernels describe auxiliary results
  // differently from the CPU kernel, so the executor checks the first call
  // of each argument signature (executor.cpp).
  bool verify_meta = false;
  bool has_meta_kernel = true;
  const c10::KernelFunction* aten_meta = nullptr;  // ATen's C++ meta kernel, where Python took over Meta (aten_meta.h)

  // From the rule table.
  bool data_dependent = false;
  bool host_indices = false;
  size_t device_only_arg = SIZE_MAX;  // an argument that is never a CPU scalar operand
  // Batch norm's running statistics: written only when the argument
  // `training` is true, whether or not the schema marks them (native_batch_norm
  // does not). A copy-on-write one gets storage of its own exactly then, as
  // on the CPU.
  std::vector<size_t> running_stats;
  size_t training_arg = 0;
  Fusion fusion = Fusion::None;
  size_t rowwise_dims_arg = 0;       // Fusion::Rowwise: the argument naming the reduced dimension(s)
  ExactKind exact = ExactKind::None;
  bool place_results = false;
  DeviceOp device_op = DeviceOp::None;
  const char* unsupported_result = nullptr;  // "quantized" or "sparse": the call raises NotImplementedError
  MetaCheck meta_check = nullptr;             // what the CPU kernel checks and the meta kernel does not
  std::optional<c10::OperatorHandle> out_op;        // the out= overload of a functional op
  std::optional<EquivalentOutCall> equivalent_out;  // without out_op

  std::string task_name;             // "aten::add.Tensor", for errors and the profiler
  OpCounter* counter = nullptr;      // this op's slot in op tracking

  // What calls of the operator have taught the executor.
  struct Learned {
    std::atomic<bool> no_meta{false};                 // a meta pass refused it for good
    std::mutex mu;
    std::unordered_map<uint64_t, bool> meta_agrees;   // verify_meta: signature -> verdict
    std::unordered_map<uint64_t, std::unique_ptr<const CallVerdict>> verdicts;  // call_signature -> its first call's verdict
    std::atomic<uint64_t> last_queued{0};             // the newest with a Queue verdict, checked without the lock
    std::unique_ptr<PlacementHistory> placement;      // place_results: which request is each result
  };
  mutable Learned learned;

  bool writes(size_t i) const;
  bool is_generator(size_t i) const;
};

// The policy of `op`. Policies live as long as the process; a thread's recent
// lookups cost no lock and no hash.
const OpPolicy& op_policy(const c10::OperatorHandle& op);

// Operators with a generic composite whose algorithm differs from the CPU
// kernel's by device type, beyond those the dispatcher shows
// (ops/cpu_kernel_preference.cpp routes them to the executor).
const std::vector<const char*>& ops_with_cpu_algorithm_choice();

} // namespace torchneuron
