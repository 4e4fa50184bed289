// The executor: how every ATen operator without an explicit kernel runs on
// `neuron`. Its policy (op_policy.h) decides which of four ways:
//
//   view          metadata only: the CPU view kernel runs on a host view and
//                 its result is re-expressed over the device storage
//   queued        the host predicts the results' metadata with the meta pass
//                 (meta.h), allocates them from the caching allocator, queues
//                 a task on the current stream and returns (launch.h); the
//                 task runs the kernel on host views of device memory, and
//                 element-wise work may join a pending fused task (fuser.h)
//   synchronous   operators whose output sizes depend on the data (nonzero,
//                 unique, equal, ...): the host waits for the stream and runs
//                 the kernel in place, as on every accelerator
//   fallback      an operator the meta pass cannot predict runs the same
//                 synchronous way; it is counted and warned about
//                 (op_tracking.h), or refused under TORCHNEURON_STRICT_FALLBACK
//
// Operators with several tensor results are verified: some meta kernels
// describe auxiliary results differently from the CPU kernel (batch norm's
// saved statistics in eval mode, embedding_bag's offset2bag, layer norm's
// mean dtype). The first call of each argument signature (dtypes, ranks,
// flags, modes) runs synchronously and its results are checked against the
// meta pass; signatures that agree are queued from then on, those that
// disagree keep running synchronously, with the CPU kernel's own metadata.
// Likewise the first call of each kernel-check signature (meta.h) of every
// queued operator runs synchronously, so that the checks a CPU kernel makes
// before touching data raise at the call, as on the CPU; only data can make a
// later call fail, and such errors are raised at the next synchronising call.
// The small calls of the lean path (../ops/lean_path.cpp) never get here.
#include "executor.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/DeviceGuard.h>

#include <optional>

#include "../device_state.h"
#include "../op_tracking.h"
#include "host_views.h"
#include "launch.h"
#include "meta.h"
#include "op_policy.h"

namespace torchneuron {
namespace {

// The one device every neuron tensor of the call is on (or a neuron Device
// argument's, for factories); raises PyTorch's usual error for mixed devices.
c10::DeviceIndex device_of_call(c10::ArrayRef<c10::IValue> args, const OpPolicy& policy) {
  c10::DeviceIndex device = -1;
  std::optional<c10::Device> other;
  for (const auto& a : args) {
    for_each_tensor(a, [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (t.device().type() == kNeuron) {
        if (device < 0) device = t.device().index();
        else if (t.device().index() != device) other = t.device();
      } else if (!(t.is_cpu() && (t.dim() == 0 || policy.host_indices))) {
        other = t.device();
      }
    });
    if (a.isDevice() && a.toDevice().type() == kNeuron && device < 0 && a.toDevice().has_index())
      device = a.toDevice().index();
  }
  if (device < 0) device = current_device();
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


// A multi-result call whose meta pass is unverified or known to disagree:
// the CPU kernel decides the metadata, and where the meta kernel got it
// wrong, what the CPU kernel did becomes the meta result for these exact
// arguments, so the next such call queues (batch norm in eval mode returns
// empty statistics).
void run_verifying(const c10::OperatorHandle& op, const OpPolicy& policy, torch::jit::Stack* stack,
                   c10::DeviceIndex device, const MetaResult& predicted, uint64_t sig, std::optional<bool> agrees) {
  const size_t n = op.schema().arguments().size(), r = op.schema().returns().size();
  auto args = torch::jit::last(*stack, n);
  MetaSignature full;  // before the call: it may change its arguments' metadata
  const bool keyed = meta_signature(op, args, policy.generators, policy.float_values_free, full);
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
    meta_cache_insert(std::move(full), std::make_shared<const MetaResult>(std::move(seen)));
  }
}

// Whether a written argument shares device memory with another argument in a
// way ATen may refuse or must order (x[1:] += x[:-1]: partial overlap; or
// too hard to tell). Meta kernels cannot see that (meta tensors have no
// addresses), so such calls run synchronously: their host views share
// storage (host_views.h), and the CPU kernel's own checks raise at the call
// with the CPU's exception, or it computes what the CPU computes.
bool writes_overlapping_memory(c10::ArrayRef<c10::IValue> args, const OpPolicy& policy) {
  for (size_t w : policy.written) {
    if (!args[w].isTensor() || !args[w].toTensor().defined()) continue;
    const at::Tensor& out = args[w].toTensor();
    for (size_t i = 0; i < args.size(); ++i) {
      if (i == w || !args[i].isTensor() || !args[i].toTensor().defined()) continue;
      const auto status = at::get_overlap_status(out, args[i].toTensor());
      if (status == at::MemOverlapStatus::Partial || status == at::MemOverlapStatus::TooHard) return true;
    }
  }
  return false;
}

// An out= call that grows an empty out argument (also how CompositeExplicit
// functionals such as abs call their out= kernel): the CPU kernel gives it the
// layout TensorIterator derives from the inputs (a transposed input, a
// transposed result), where Python meta kernels make it contiguous.
bool grows_empty_out(c10::ArrayRef<c10::IValue> args, const OpPolicy& policy, const MetaResult& predicted) {
  for (size_t k = 0; k < policy.written.size(); ++k) {
    const c10::IValue& a = args[policy.written[k]];
    if (a.isTensor() && a.toTensor().defined() && a.toTensor().numel() == 0 && k < predicted.written.size() &&
        predicted.written[k].defined() && predicted.written[k].numel() > 0)
      return true;
  }
  return false;
}

// Runs such a call synchronously, and what the CPU kernel did to the written
// arguments becomes the meta result for these exact arguments, so the next
// such call queues with the CPU's layout.
void run_observing_growth(const c10::OperatorHandle& op, const OpPolicy& policy, torch::jit::Stack* stack,
                          c10::DeviceIndex device, const MetaResult& predicted) {
  const size_t n = op.schema().arguments().size();
  auto args = torch::jit::last(*stack, n);
  MetaSignature full;  // before the call: it changes its arguments' metadata
  const bool keyed = meta_signature(op, args, policy.generators, policy.float_values_free, full);
  std::vector<at::Tensor> written;
  for (size_t k : policy.written) written.push_back(args[k].isTensor() ? args[k].toTensor() : at::Tensor());
  run_synchronously(op, policy, stack, device);
  if (!keyed) return;
  MetaResult seen{predicted.returns, {}, true};
  for (const at::Tensor& w : written) seen.written.push_back(meta_view(w));
  meta_cache_insert(std::move(full), std::make_shared<const MetaResult>(std::move(seen)));
}

// Whether the CPU kernel has accepted a call with this kernel-check signature
// (meta.h): then a failure can only come from the data, and the call may queue.
bool kernel_accepted(const OpPolicy& policy, uint64_t sig) {
  if (policy.learned.last_accepted.load(std::memory_order_relaxed) == sig) return true;
  std::lock_guard<std::mutex> lock(policy.learned.mu);
  if (!policy.learned.kernel_accepted.count(sig)) return false;
  policy.learned.last_accepted.store(sig, std::memory_order_relaxed);
  return true;
}

void accept_kernel(const OpPolicy& policy, uint64_t sig) {
  std::lock_guard<std::mutex> lock(policy.learned.mu);
  policy.learned.kernel_accepted.insert(sig);
  policy.learned.last_accepted.store(sig, std::memory_order_relaxed);
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
  const OpPolicy& policy = op_policy(op);
  const auto& schema = op.schema();
  auto args = torch::jit::last(*stack, schema.arguments().size());
  const c10::DeviceIndex device = device_of_call(args, policy);
  std::optional<c10::DeviceGuard> guard;  // a guard's virtual calls only when the device changes
  if (current_device() != device) guard.emplace(c10::Device(kNeuron, device));

  TORCH_CHECK_NOT_IMPLEMENTED(!policy.unsupported_result, "neuron: ", schema.operator_name(), " returns a ",
                              policy.unsupported_result, " tensor, and neuron tensors are dense (strided) only; ",
                              "run it on the CPU (move its inputs with .cpu())");
  if (policy.view) {
    record_execution(*policy.counter, Execution::Queued);
    return run_view(op, policy, stack);
  }
  if (!policy.written.empty() && writes_overlapping_memory(args, policy)) {
    record_execution(*policy.counter, Execution::Synchronizing);
    return run_synchronously(op, policy, stack, device);
  }
  MetaFailure failure = MetaFailure::NoMetaKernel;
  if (policy.tensor_returns && !policy.data_dependent && !policy.learned.no_meta) {
    std::shared_ptr<const MetaResult> predicted;
    failure = run_meta(op, policy, args, predicted);
    if (failure == MetaFailure::None) {
      // A kernel's own checks (dtypes it is built for, argument checks the
      // meta kernel lacks) raise at the call on the CPU: the first call of
      // each kernel-check signature runs synchronously so they do here too.
      const uint64_t check = kernel_check_signature(args);
      if (!predicted->observed && grows_empty_out(args, policy, *predicted)) {
        record_execution(*policy.counter, Execution::Synchronizing);
        run_observing_growth(op, policy, stack, device, *predicted);
        return accept_kernel(policy, check);
      }
      std::optional<bool> agrees;
      uint64_t sig = 0;
      if (policy.verify_meta && !predicted->observed) agrees = meta_verdict(policy, sig = verification_signature(args));
      if (!policy.verify_meta || predicted->observed || agrees.value_or(false)) {
        if (!kernel_accepted(policy, check)) {
          record_execution(*policy.counter, Execution::Synchronizing);
          run_synchronously(op, policy, stack, device);
          return accept_kernel(policy, check);
        }
        record_execution(*policy.counter, Execution::Queued);
        return launch_queued(op, policy, stack, device, predicted->returns, predicted->written);
      }
      run_verifying(op, policy, stack, device, *predicted, sig, agrees);
      record_execution(*policy.counter, Execution::Synchronizing);
      return accept_kernel(policy, check);
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
