// The executor: how every ATen operator without an explicit kernel runs on
// `neuron`. Its policy (op_policy.h) decides which of four ways:
//
//   view          metadata only: the CPU view kernel runs on a host view and
//                 its result is re-expressed over the device storage
//   queued        the host predicts the results' metadata with the meta pass
//                 (meta.h), allocates them from the caching allocator, queues
//                 a task on the current stream and returns (launch.h); the
//                 task runs the kernel on host views of device memory, and
//                 element-wise work may join a pending fused task (fusion_offer.h)
//   synchronous   operators whose output sizes depend on the data (nonzero,
//                 unique, equal, ...): the host waits for the stream and runs
//                 the kernel in place, as on every accelerator
//   synchronous   an operator the meta pass cannot predict runs the same
//   fallback      synchronous way; it is counted and warned about
//                 (../sanitizers/op_tracking.h), or refused under
//                 TORCHNEURON_STRICT_FALLBACK
//
// Operators with several tensor results are verified: some meta kernels
// describe auxiliary results differently from the CPU kernel (batch norm's
// saved statistics in eval mode, embedding_bag's offset2bag, layer norm's
// mean dtype). The first call of each argument signature (dtypes, ranks,
// flags, modes) runs synchronously and its results are checked against the
// meta pass; signatures that agree are queued from then on, those that
// disagree keep running synchronously, with the CPU kernel's own metadata.
// Likewise the first call of each call signature (meta.h: dtypes, ranks,
// layout classes, Scalar value classes, overlaps, flags) of every queued
// operator runs synchronously, so that the checks a CPU kernel makes before
// touching data raise at the call, as on the CPU, and the CPU kernel's
// results judge the meta pass's prediction: later calls queue as predicted,
// queue in the layouts the CPU kernel gave, or keep running synchronously
// (call_verdicts.h). Only data can make a later call fail, and such errors
// are raised at the next synchronising call.
// The small calls of the lean path (../ops/lean_path.cpp) never get here.
#include "executor.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/DeviceGuard.h>

#include <optional>

#include "../device_state.h"
#include "../sanitizers/memcheck.h"
#include "../sanitizers/op_tracking.h"
#include "call_verdicts.h"
#include "host_views.h"
#include "launch.h"
#include "meta.h"
#include "op_policy.h"

namespace torchneuron {
namespace {

// The one device every neuron tensor of the call is on (or a neuron Device
// argument's, for factories); raises PyTorch's usual error for mixed devices.
// CPU tensors are accepted where CUDA accepts them, as operands only: a
// zero-dimensional one (a scalar; not index_fill's index, which CUDA refuses,
// op_policy.cpp), and index tensors of the operators that take them on the host. An argument the call writes (out=, self of an
// in-place operator) is never on the CPU: the kernel would write host memory
// from a device task.
c10::DeviceIndex device_of_call(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args,
                                const OpPolicy& policy) {
  c10::DeviceIndex device = -1;
  std::optional<c10::Device> other;
  std::optional<size_t> written_elsewhere;  // a written argument not on neuron
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    const bool written = policy.writes(i);
    for_each_tensor(a, [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (t.device().type() == kNeuron) {
        if (device < 0) device = t.device().index();
        else if (t.device().index() != device) other = t.device();
      } else if (written || !(t.is_cpu() && ((t.dim() == 0 && i != policy.device_only_arg) || policy.host_indices))) {
        other = t.device();
        if (written && !written_elsewhere) written_elsewhere = i;
      }
    });
    if (a.isDevice() && a.toDevice().type() == kNeuron && device < 0 && a.toDevice().has_index())
      device = a.toDevice().index();
  }
  if (device < 0) device = current_device();
  TORCH_CHECK(!written_elsewhere, "Expected all tensors to be on the same device, but found at least two devices, neuron:",
              int(device), " and ", *other, "! (", schema.operator_name(), " writes its argument '",
              schema.arguments()[*written_elsewhere].name(), "', which is on ", *other,
              "; a CPU tensor is accepted only as a zero-dimensional operand)");
  TORCH_CHECK(!other, "Expected all tensors to be on the same device, but found at least two devices, neuron:",
              int(device), " and ", *other, "!");
  return device;
}

// A view op's result re-expressed over the device tensor's storage.
at::Tensor device_view(const at::Tensor& base, const at::Tensor& host_result) {
  auto out = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(base.storage()),
                                                      base.key_set(), host_result.dtype());
  auto* impl = out.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(host_result.sizes(), host_result.strides(), host_result.storage_offset());
  impl->_set_conj(host_result.is_conj());
  impl->_set_neg(host_result.is_neg());
  return out;
}

void run_view(const c10::OperatorHandle& op, const OpPolicy& policy, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  std::vector<c10::IValue> originals(stack->end() - n, stack->end());
  for (auto it = stack->end() - n; it != stack->end(); ++it)
    *it = map_tensors(*it, [](const at::Tensor& t) { return host_view(t); });
  {
    auto guard = below_autograd();
    op.callBoxed(stack);
  }
  const size_t r = op.schema().returns().size();
  for (size_t i = 0; i < r; ++i) {
    auto& ret = (*stack)[stack->size() - r + i];
    int src = policy.source[i];
    TORCH_INTERNAL_ASSERT(src >= 0 && originals[src].isTensor(), "neuron: unsupported view op ", op.schema());
    const at::Tensor& base = originals[src].toTensor();
    ret = map_tensors(ret, [&](const at::Tensor& t) { return device_view(base, t); });
  }
}


// Copy-on-write storages among the arguments the call writes get storage of
// their own first (host_views.h), as a CPU kernel's first write does.
void materialize_written(const OpPolicy& policy, c10::ArrayRef<c10::IValue> args) {
  const bool stats = !policy.running_stats.empty() && args[policy.training_arg].toBool();
  for (size_t w : policy.written) {
    const bool stat = std::find(policy.running_stats.begin(), policy.running_stats.end(), w) != policy.running_stats.end();
    if (!stat || stats) for_each_tensor(args[w], materialize_for_write);
  }
  if (stats)
    for (size_t w : policy.running_stats) for_each_tensor(args[w], materialize_for_write);
}

// Whether a written argument shares device memory with another argument,
// as ATen's overlap checks see it, and what of that can decide whether the
// CPU kernel accepts the call: a written argument with internal overlap (an
// expanded tensor) or the same memory as an operand (x.add_(x), and
// index_put_ refuses that). Meta kernels cannot see overlap (meta tensors
// have no addresses), so it is part of the call signature.
struct WriteOverlap {
  bool partial = false;  // x[1:] += x[:-1], or too hard to tell
  uint64_t kind = 0;     // internal and full overlaps, as a signature word
};

WriteOverlap overlap_of_writes(c10::ArrayRef<c10::IValue> args, const OpPolicy& policy) {
  WriteOverlap o;
  for (size_t w : policy.written) {
    if (!args[w].isTensor() || !args[w].toTensor().defined()) continue;
    const at::Tensor& out = args[w].toTensor();
    o.kind = o.kind * 3 + (at::has_internal_overlap(out) == at::MemOverlap::Yes);
    for (size_t i = 0; i < args.size(); ++i) {
      if (i == w || !args[i].isTensor() || !args[i].toTensor().defined()) continue;
      const auto status = at::get_overlap_status(out, args[i].toTensor());
      if (status == at::MemOverlapStatus::Partial || status == at::MemOverlapStatus::TooHard) o.partial = true;
      if (status == at::MemOverlapStatus::Full) o.kind = o.kind * 67 + i + 1;
    }
  }
  return o;
}

// Whether the meta pass resizes a written argument in a way only the CPU
// kernel handles: an in-place operator's self (the CPU raises: the result
// would broadcast self), a non-empty out= (the CPU warns and restrides it),
// an empty out= that is also an operand (the CPU's kernel reads the operand
// before it resizes the out). An empty out= that grows (how
// CompositeExplicit functionals such as abs call their out= kernel) queues,
// and the in-place view operators (squeeze_, t_) change sizes by design.
bool resize_needs_the_cpu_kernel(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                 const OpPolicy& policy, const MetaResult& predicted) {
  for (size_t k = 0; k < policy.written.size() && k < predicted.written.size(); ++k) {
    const size_t w = policy.written[k];
    if (!args[w].isTensor() || !predicted.written[k].defined()) continue;
    const at::Tensor& t = args[w].toTensor();
    if (!t.defined() || t.sizes() == predicted.written[k].sizes()) continue;
    if (!op.schema().arguments()[w].is_out()) {
      if (!op.hasTag(at::Tag::inplace_view)) return true;
      continue;
    }
    if (t.numel() != 0) return true;
    for (size_t i = 0; i < args.size(); ++i)
      if (i != w && args[i].isTensor() && args[i].toTensor().defined() &&
          (args[i].toTensor().is_same(t) || args[i].toTensor().storage().is_alias_of(t.storage())))
        return true;
  }
  return false;
}

// The verdict for call signature `sig` (call_verdicts.h), or null before its
// first call. Verdicts live as long as the policy; the newest Queue verdict
// is found without the lock.
const CallVerdict* verdict_of(const OpPolicy& policy, uint64_t sig) {
  static const CallVerdict queue;
  if (policy.learned.last_queued.load(std::memory_order_relaxed) == sig) return &queue;
  std::lock_guard<std::mutex> lock(policy.learned.mu);
  auto it = policy.learned.verdicts.find(sig);
  if (it == policy.learned.verdicts.end()) return nullptr;
  if (it->second->kind == CallVerdict::Kind::Queue) policy.learned.last_queued.store(sig, std::memory_order_relaxed);
  return it->second.get();
}

// The written arguments of a call on `stack`: device tensors, whose metadata
// the call updates in place.
std::vector<at::Tensor> written_arguments(const OpPolicy& policy, c10::ArrayRef<c10::IValue> args) {
  std::vector<at::Tensor> written;
  for (size_t w : policy.written) written.push_back(args[w].isTensor() ? args[w].toTensor() : at::Tensor());
  return written;
}

// Judges a first call that ran synchronously (call_verdicts.h); whether the
// signature's later calls queue.
bool record_verdict(const c10::OperatorHandle& op, const OpPolicy& policy, const torch::jit::Stack& stack,
                    const MetaResult& predicted, const std::vector<at::Tensor>& written, uint64_t call) {
  auto verdict = std::make_unique<const CallVerdict>(
      judge_first_call(policy, predicted, torch::jit::last(stack, op.schema().returns().size()), written));
  const bool queues = verdict->kind != CallVerdict::Kind::Synchronous;
  std::lock_guard<std::mutex> lock(policy.learned.mu);
  policy.learned.verdicts.emplace(call, std::move(verdict));
  return queues;
}

// The first call of a call signature: synchronous, and judged.
void run_first_call(const c10::OperatorHandle& op, const OpPolicy& policy, torch::jit::Stack* stack,
                    c10::DeviceIndex device, const MetaResult& predicted, uint64_t call) {
  const auto written = written_arguments(policy, torch::jit::last(*stack, op.schema().arguments().size()));
  memcheck::FirstCall first(device, op.schema().name());  // (memcheck.h)
  run_synchronously(op, policy, stack, device);
  if (record_verdict(op, policy, *stack, predicted, written, call)) first.queues_later();
}

// A later call in the layouts its signature's first call taught; the laid
// out prediction is cached for these exact arguments.
void launch_in_learned_layouts(const c10::OperatorHandle& op, const OpPolicy& policy, torch::jit::Stack* stack,
                               c10::DeviceIndex device, const std::shared_ptr<const MetaResult>& predicted,
                               const CallVerdict& verdict) {
  std::shared_ptr<const MetaResult> laid = predicted;
  if (!predicted->observed) {
    laid = in_learned_layouts(policy, *predicted, verdict);
    MetaSignature sig;
    if (meta_signature(op, torch::jit::last(*stack, op.schema().arguments().size()), policy.generators,
                       policy.float_values_free, sig))
      meta_cache_insert(std::move(sig), laid);
  }
  launch_queued(op, policy, stack, device, laid->returns, laid->written);
}

// A multi-result call whose meta pass is unverified or known to disagree:
// the CPU kernel decides the metadata, and where the meta kernel got it
// wrong, what the CPU kernel did becomes the meta result for these exact
// arguments, so the next such call queues (batch norm in eval mode returns
// empty statistics). It is its call signature's first call.
void run_verifying(const c10::OperatorHandle& op, const OpPolicy& policy, torch::jit::Stack* stack,
                   c10::DeviceIndex device, const MetaResult& predicted, uint64_t sig, std::optional<bool> agrees,
                   uint64_t call) {
  const size_t n = op.schema().arguments().size(), r = op.schema().returns().size();
  auto args = torch::jit::last(*stack, n);
  MetaSignature full;  // before the call: it may change its arguments' metadata
  const bool keyed = meta_signature(op, args, policy.generators, policy.float_values_free, full);
  const auto written = written_arguments(policy, args);
  memcheck::FirstCall first(device, op.schema().name());  // (memcheck.h)
  run_synchronously(op, policy, stack, device);
  const auto& meta = predicted.returns;
  const bool ok = results_match_meta(policy, torch::jit::last(*stack, r), torch::jit::last(meta, r));
  if (!agrees) {
    std::lock_guard<std::mutex> lock(policy.learned.mu);
    policy.learned.meta_agrees[sig] = ok;
  }
  if (!ok && keyed) {
    MetaResult seen{{}, predicted.written, true};
    for (size_t i = 0; i < r; ++i)
      seen.returns.push_back(policy.source[i] >= 0 ? meta[i] : map_tensors((*stack)[stack->size() - r + i], [](const at::Tensor& t) {
        return meta_view(t);
      }));
    // The call signature's verdict, for calls whose prediction is what the
    // CPU kernel did (those that disagree keep running verified).
    if (record_verdict(op, policy, *stack, seen, written, call)) first.queues_later();
    meta_cache_insert(std::move(full), std::make_shared<const MetaResult>(std::move(seen)));
  } else if (ok) {
    if (record_verdict(op, policy, *stack, predicted, written, call)) first.queues_later();
  }
}

// Whether a verified call with these arguments may queue; nullopt when its
// signature has not been seen.
std::optional<bool> meta_verdict(const OpPolicy& policy, uint64_t sig) {
  std::lock_guard<std::mutex> lock(policy.learned.mu);
  auto it = policy.learned.meta_agrees.find(sig);
  return it == policy.learned.meta_agrees.end() ? std::nullopt : std::optional<bool>(it->second);
}

} // namespace

void execute(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  runtime::memcheck::DeviceAccess access;  // (memcheck.h) synchronous paths run kernels on this thread
  const OpPolicy& policy = op_policy(op);
  const auto& schema = op.schema();
  auto args = torch::jit::last(*stack, schema.arguments().size());
  const c10::DeviceIndex device = device_of_call(schema, args, policy);
  std::optional<c10::DeviceGuard> guard;  // a guard's virtual calls only when the device changes
  if (current_device() != device) guard.emplace(c10::Device(kNeuron, device));

  TORCH_CHECK_NOT_IMPLEMENTED(!policy.unsupported_result, "neuron: ", schema.operator_name(), " returns a ",
                              policy.unsupported_result, " tensor, and neuron tensors are dense (strided) only; ",
                              "run it on the CPU (move its inputs with .cpu())");
  if (policy.view) {
    record_execution(*policy.counter, Execution::Queued);
    return run_view(op, policy, stack);
  }
  materialize_written(policy, args);
  WriteOverlap overlap;
  if (!policy.written.empty()) {
    overlap = overlap_of_writes(args, policy);
    if (overlap.partial) {
      record_execution(*policy.counter, Execution::Synchronizing);
      return run_synchronously(op, policy, stack, device);
    }
  }
  MetaFailure failure = MetaFailure::NoMetaKernel;
  if (policy.tensor_returns && !policy.data_dependent && !policy.learned.no_meta) {
    std::shared_ptr<const MetaResult> predicted;
    failure = run_meta(op, policy, args, predicted);
    if (failure == MetaFailure::None) {
      if (!policy.written.empty() && resize_needs_the_cpu_kernel(op, args, policy, *predicted)) {
        record_execution(*policy.counter, Execution::Synchronizing);
        return run_synchronously(op, policy, stack, device);
      }
      const uint64_t call = call_signature(args) * 1099511628211ull + overlap.kind;
      std::optional<bool> agrees;
      uint64_t sig = 0;
      if (policy.verify_meta && !predicted->observed) agrees = meta_verdict(policy, sig = verification_signature(args));
      if (!policy.verify_meta || predicted->observed || agrees.value_or(false)) {
        const CallVerdict* verdict = verdict_of(policy, call);
        if (verdict && verdict->kind == CallVerdict::Kind::Queue) {
          record_execution(*policy.counter, Execution::Queued);
          return launch_queued(op, policy, stack, device, predicted->returns, predicted->written);
        }
        if (verdict && verdict->kind == CallVerdict::Kind::QueueInLayouts) {
          record_execution(*policy.counter, Execution::Queued);
          return launch_in_learned_layouts(op, policy, stack, device, predicted, *verdict);
        }
        record_execution(*policy.counter, Execution::Synchronizing);
        if (verdict) return run_synchronously(op, policy, stack, device);
        return run_first_call(op, policy, stack, device, *predicted, call);
      }
      record_execution(*policy.counter, Execution::Synchronizing);
      return run_verifying(op, policy, stack, device, *predicted, sig, agrees, call);
    }
  }
  const bool expected_sync = policy.data_dependent || !policy.tensor_returns || failure == MetaFailure::DataDependent;
  if (!expected_sync) {
    TORCH_CHECK_NOT_IMPLEMENTED(!strict_fallback(), "neuron: ", schema.operator_name(),
                                " cannot be queued (its output sizes are unknown before it runs) and "
                                "TORCHNEURON_STRICT_FALLBACK=1 forbids the synchronous fallback");
  }
  run_synchronously(op, policy, stack, device);
  if (!expected_sync && first_fallback(schema.operator_name()))
    TORCH_WARN("neuron: ", schema.operator_name(), " cannot be queued (its output sizes are unknown before ",
               "it runs), so it ran synchronously: the host waited for the device. It still ran on device ",
               "memory. See torchneuron.get_fallback_ops().");
  record_execution(*policy.counter, expected_sync ? Execution::Synchronizing : Execution::Fallback);
}

} // namespace torchneuron
