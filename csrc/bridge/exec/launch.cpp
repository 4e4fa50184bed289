#include "launch.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/TypeProperties.h>

#include <mutex>
#include <utility>

#include "../device_state.h"
#include "../generator.h"
#include "../kernels/device_ops.h"
#include "../sanitizers/memcheck.h"
#include "fusion_offer.h"
#include "host_scalar.h"
#include "host_views.h"
#include "op_policy.h"
#include "result_copy.h"
#include "result_placement.h"
#include "storage_resize.h"
#include "thread_count.h"

namespace torchneuron {
namespace {

// Warnings of a queued task are dropped: the host-side meta pass of the same
// call already ran the checks that warn, and an executor thread has no Python
// frame to attribute a warning to.
struct DropWarnings final : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

// A host tensor argument as a device task sees it: a snapshot taken at the
// launch, as a copy to the device would be.
at::Tensor snapshot(const at::Tensor& host_tensor) {
  auto copy = host_tensor.clone();
  if (host_tensor.unsafeGetTensorImpl()->is_wrapped_number()) copy.unsafeGetTensorImpl()->set_wrapped_number(true);
  return copy;
}

// Host-side form of an argument for a device task: device tensors become
// host views; host tensors (scalars, indices) are snapshotted now, as a copy to
// the device at launch would; generators become this op's claimed engine.
c10::IValue task_arg(const c10::IValue& a, size_t i, const OpPolicy& policy, c10::DeviceIndex device,
                     bool snapshot_host, bool resizable) {
  if (policy.is_generator(i))
    return claim_engine(a.isNone() ? std::nullopt : std::optional<at::Generator>(a.toGenerator()), device);
  if (a.isDevice()) return device_arg_as(a, c10::kCPU);
  return map_tensors(a, [&](const at::Tensor& t) {
    if (!t.defined()) return t;
    if (t.device().type() == kNeuron) return host_view(t, resizable);
    return snapshot_host ? snapshot(t) : t;
  });
}

// What a queued task gets: host values now (zero-dimensional host tensors as
// their values: HostScalar), device tensors as metadata only
// (DeferredHostView: the task makes their views when it runs), whether they
// are arguments of their own or elements of a Tensor[] / Tensor?[] list. A
// device tensor passed more than once gets one host view, as on the CPU the
// kernel gets one tensor: kernels test arguments for identity
// (_native_multi_head_attention projects q, k and v with one matrix product
// when they are the same tensor, which rounds otherwise).
struct TaskValues {
  struct Deferred {
    size_t index = 0;     // into values
    int64_t element = -1; // the list element it fills, or -1 for values[index] itself
    int same_as = -1;     // an earlier entry for the same device tensor, whose view it shares
    const c10::TensorImpl* device_tensor = nullptr;  // compared at the launch, never dereferenced
    DeferredHostView view;
  };
  std::vector<c10::IValue> values;
  c10::SmallVector<Deferred, 3> deferred;
  c10::SmallVector<std::pair<size_t, HostScalar>, 2> scalars;  // (index into values, value)

  void add(const at::Tensor& device_tensor) {
    defer(values.size(), -1, device_tensor);
    values.emplace_back();
  }
  // `host_tensor` passed HostScalar::fits.
  void add_scalar(const at::Tensor& host_tensor) {
    scalars.emplace_back(values.size(), HostScalar(host_tensor));
    values.emplace_back();
  }
  // A list whose device tensors are left empty (undefined or None) until
  // make(); host tensors in it are snapshotted.
  void add_list(const c10::IValue& list) {
    const size_t index = values.size();
    auto element = [&](const at::Tensor& t, int64_t k) {
      if (!t.defined() || t.device().type() != kNeuron) return t.defined() ? snapshot(t) : t;
      defer(index, k, t);
      return at::Tensor();
    };
    if (list.isTensorList()) {
      c10::List<at::Tensor> tensors = list.toTensorList(), copy;
      copy.reserve(tensors.size());
      for (size_t k = 0; k < tensors.size(); ++k) copy.push_back(element(tensors[k], static_cast<int64_t>(k)));
      values.emplace_back(std::move(copy));
    } else {
      // Tensor?[]: typed so, or, from TorchScript's interpreter once it has
      // profiled a graph, a generic list of tensors and Nones.
      const c10::List<c10::IValue> items = list.toList();
      c10::List<std::optional<at::Tensor>> copy;
      copy.reserve(items.size());
      for (size_t k = 0; k < items.size(); ++k) {
        const c10::IValue item = items.get(k);
        copy.push_back(item.isTensor() ? std::optional<at::Tensor>(element(item.toTensor(), static_cast<int64_t>(k)))
                                       : std::nullopt);
      }
      values.emplace_back(std::move(copy));
    }
  }
  void make(bool resizable = false) {
    for (const auto& [index, scalar] : scalars) values[index] = scalar.tensor();
    scalars.clear();
    c10::SmallVector<at::Tensor, 3> views;
    for (const auto& d : deferred) {
      at::Tensor view = d.same_as >= 0 ? views[d.same_as] : d.view.make(resizable);
      if (d.element < 0) values[d.index] = view;
      else values[d.index].toList().set(d.element, view);
      views.push_back(std::move(view));
    }
    deferred.clear();
  }

 private:
  void defer(size_t index, int64_t element, const at::Tensor& device_tensor) {
    auto& d = deferred.emplace_back();  // in place: a DeferredHostView is large to move
    d.index = index;
    d.element = element;
    d.device_tensor = device_tensor.unsafeGetTensorImpl();
    d.same_as = -1;
    for (size_t k = 0; k + 1 < deferred.size(); ++k)
      if (deferred[k].device_tensor == d.device_tensor) {
        d.same_as = static_cast<int>(k);
        return;
      }
    d.view.assign(device_tensor);
  }
};

// Everything one queued call hands its task. The host fills it and the
// executor releases it: glibc's per-thread caches serve such cross-thread
// pairs only through the locked arena, at hundreds of instructions a block,
// so records are recycled instead, vectors keeping their capacity.
struct Launch {
  TaskValues task_args, outputs;
  // The caller's grad mode: some CPU kernels read it (mkldnn_rnn_layer runs
  // oneDNN's training or inference LSTM by it), and the task runs on the
  // device's thread, whose own mode is the default.
  bool grad_enabled = true;
  // out= arguments the kernel grows itself (grown_by_the_kernel).
  c10::SmallVector<size_t, 2> grown_out;
};

// Recycled records. Each thread keeps its own few and trades them with the
// shared list a batch at a time: the host takes records and the executor
// gives them back, and one lock per record would pass the lock's cache line
// between the two cores at every launch.
class LaunchPool {
 public:
  static LaunchPool& instance() {
    static LaunchPool* pool = new LaunchPool();  // never destroyed: executors may outlive statics
    return *pool;
  }

  Launch* take() {
    Local& local = local_records();
    if (local.records.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      const size_t n = std::min(kBatch, shared_.size());
      local.records.assign(shared_.end() - n, shared_.end());
      shared_.resize(shared_.size() - n);
    }
    if (local.records.empty()) return new Launch();
    Launch* l = local.records.back();
    local.records.pop_back();
    return l;
  }
  void give(Launch* l) {
    for (TaskValues* v : {&l->task_args, &l->outputs}) {
      v->values.clear();
      v->deferred.clear();
      v->scalars.clear();
    }
    l->grown_out.clear();
    Local& local = local_records();
    local.records.push_back(l);
    if (local.records.size() >= 2 * kBatch) give_back(local, kBatch);
  }

 private:
  static constexpr size_t kBatch = 32;
  static constexpr size_t kKept = 1024;  // about the most tasks a burst keeps in flight

  struct Local {
    std::vector<Launch*> records;
    ~Local() { instance().give_back(*this, records.size()); }  // a thread that ends hands its records on
  };
  static Local& local_records() {
    static thread_local Local local;
    return local;
  }
  void give_back(Local& local, size_t n) {
    auto first = local.records.end() - static_cast<std::ptrdiff_t>(n);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = first; it != local.records.end(); ++it) {
        if (shared_.size() < kKept) shared_.push_back(*it);
        else delete *it;
      }
    }
    local.records.erase(first, local.records.end());
  }

  std::mutex mu_;
  std::vector<Launch*> shared_;
};

// Owns a Launch for the task's closure.
class LaunchRef {
 public:
  LaunchRef() : p_(LaunchPool::instance().take()) {}
  LaunchRef(const LaunchRef&) = delete;
  LaunchRef(LaunchRef&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  LaunchRef& operator=(const LaunchRef&) = delete;
  LaunchRef& operator=(LaunchRef&&) = delete;
  ~LaunchRef() {
    if (p_) LaunchPool::instance().give(p_);
  }
  Launch* operator->() const { return p_; }
  Launch& operator*() const { return *p_; }

 private:
  Launch* p_;
};

// The empty floating-point out= arguments the call grows into another dtype
// than its operands' result type. Given such an out, ATen computes
// otherwise than into an out it grows (a cast result can differ in the last
// bit), so the kernel gets an empty out to grow, as on the CPU, and the task
// copies it into the memory allocated at the call.
c10::SmallVector<size_t, 2> grown_by_the_kernel(const c10::OperatorHandle& op, const OpPolicy& policy,
                                                c10::ArrayRef<c10::IValue> args,
                                                const std::vector<at::Tensor>& meta_written) {
  c10::SmallVector<size_t, 2> grown;
  for (size_t k = 0; k < policy.written.size(); ++k) {
    const size_t w = policy.written[k];
    if (!op.schema().arguments()[w].is_out() || !args[w].isTensor() || !meta_written[k].defined()) continue;
    const at::Tensor& out = args[w].toTensor();
    if (!out.defined() || out.numel() != 0 || out.sizes() == meta_written[k].sizes() ||
        !(at::isFloatingType(out.scalar_type()) || at::isComplexType(out.scalar_type())))
      continue;
    at::native::ResultTypeState operands;
    for (size_t i = 0; i < args.size(); ++i) {
      if (policy.writes(i)) continue;
      if (args[i].isScalar()) operands = at::native::update_result_type_state(args[i].toScalar(), operands);
      else for_each_tensor(args[i], [&](const at::Tensor& t) {
        if (t.defined()) operands = at::native::update_result_type_state(t, operands);
      });
    }
    if (at::native::result_type(operands) != out.scalar_type()) grown.push_back(w);
  }
  return grown;
}

bool fusable_size(const c10::IValue& v, int64_t fusable) { return v.isTensor() && v.toTensor().numel() >= fusable; }

// The call's written arguments take the metadata the meta pass gave
// them, and the out= arguments the kernel grows itself are noted for the task.
void adopt_written_metadata(const c10::OperatorHandle& op, const OpPolicy& policy, c10::ArrayRef<c10::IValue> args,
                            const std::vector<at::Tensor>& meta_written, Launch& launch) {
  if (!policy.written.empty()) launch.grown_out = grown_by_the_kernel(op, policy, args, meta_written);
  for (size_t k = 0; k < policy.written.size(); ++k)
    if (meta_written[k].defined()) adopt_metadata(args[policy.written[k]].toTensor(), meta_written[k]);
}

// The results. An argument the operator returns (in place, out=) is
// returned as it is; the others are allocated on the device now, as the meta
// pass predicted them, and become the task's outputs. True if one is large
// enough to fuse.
bool allocate_results(const OpPolicy& policy, c10::ArrayRef<c10::IValue> args, const std::vector<c10::IValue>& meta,
                      c10::DeviceIndex device, int64_t fusable, c10::SmallVector<c10::IValue, 4>& results,
                      TaskValues& outputs) {
  bool large = false;
  for (size_t i = 0; i < results.size(); ++i) {
    if (policy.source[i] >= 0) {
      results[i] = args[policy.source[i]];
      continue;
    }
    auto empty_like = [&](const at::Tensor& m) { return m.defined() ? empty_like_on(m, device) : m; };
    results[i] = meta[i].isTensor() ? c10::IValue(empty_like(meta[i].toTensor())) : map_tensors(meta[i], empty_like);
    large |= fusable_size(results[i], fusable);
    if (results[i].isTensor() && results[i].toTensor().defined())
      outputs.add(results[i].toTensor());
    else
      outputs.values.push_back(map_tensors(results[i], [](const at::Tensor& t) { return host_view(t); }));
  }
  return large;
}

// The task's arguments, in the form the task takes them (TaskValues).
// True if one is large enough to fuse.
bool take_task_args(const OpPolicy& policy, c10::ArrayRef<c10::IValue> args, c10::DeviceIndex device, int64_t fusable,
                    TaskValues& task_args) {
  bool large = false;
  for (size_t i = 0; i < args.size(); ++i) {
    large |= fusable_size(args[i], fusable);
    const bool device_tensor =
        args[i].isTensor() && args[i].toTensor().defined() && args[i].toTensor().device().type() == kNeuron;
    if (device_tensor && !policy.is_generator(i))
      task_args.add(args[i].toTensor());
    else if (args[i].isTensor() && HostScalar::fits(args[i].toTensor()))
      task_args.add_scalar(args[i].toTensor());
    else if (policy.is_tensor_list[i] && args[i].isList())
      task_args.add_list(args[i]);
    else
      task_args.values.push_back(task_arg(args[i], i, policy, device, true, false));
  }
  return large;
}

// An element-wise call offered to adaptive eager (fusion_offer.h).
// True if the fuser queued it; false leaves the launch to be queued alone.
bool offered_to_fusion(const c10::OperatorHandle& op, const std::optional<c10::OperatorHandle>& out_op,
                       const OpPolicy& policy, Launch& launch, rt::Stream& stream) {
  SharedHostStorages shared;
  launch.task_args.make();
  launch.outputs.make();
  ElementwiseCall call{out_op ? *out_op : op, launch.task_args.values, {}, &policy};
  if (out_op)
    call.args.insert(call.args.end(), launch.outputs.values.begin(), launch.outputs.values.end());
  else
    for (const auto& o : launch.outputs.values) call.results.push_back(o.toTensor());
  return translate_errors([&] { return offer_to_fuser(stream, call); });
}

// The task of an out= overload. Some out= kernels resize their output as
// scratch (mse_loss.out): they get resizable host views, and results that
// moved come back.
void run_out_variant(const c10::OperatorHandle& out_op, const OpPolicy& policy, TaskValues& outputs,
                     torch::jit::Stack& s) {
  std::vector<at::Tensor> flexible;
  for (auto& o : outputs.values)
    flexible.push_back(o.isTensor() ? host_view(o.toTensor(), /*resizable=*/true) : at::Tensor());
  for (const auto& d : outputs.deferred) flexible[d.index] = d.view.make(/*resizable=*/true);
  for (auto& f : flexible) s.push_back(f);
  call_kernel(out_op, policy, &s);
  for (const auto& d : outputs.deferred)
    if (flexible[d.index].storage().data() != d.view.data) d.view.make().copy_(flexible[d.index]);
}

// The task of a functional or in-place overload: its results are placed in
// (or copied into) the device memory allocated for them at the call.
void run_functional(const c10::OperatorHandle& op, const OpPolicy& policy, Launch& launch, torch::jit::Stack& s) {
  launch.outputs.make();
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 2> grown;  // (device memory's view, the kernel's out)
  for (size_t w : launch.grown_out) {
    grown.emplace_back(s[w].toTensor(), at::empty({0}, s[w].toTensor().options()));
    s[w] = grown.back().second;
  }
  PlaceResults placing(launch.outputs.values, policy.place_results, policy.learned.placement.get(), s);
  call_kernel(op, policy, &s);
  for (auto& [view, out] : grown) view.copy_(out);
  std::vector<c10::IValue> results;
  for (size_t i = 0; i < s.size(); ++i)
    if (policy.source[i] < 0) results.push_back(std::move(s[i]));
  s.clear();
  placing.settle(std::move(results));
}

// A queued task, on the executor: the kernel on host views of the launch's
// values, with the caller's grad mode and the task's warnings dropped.
void run_queued_task(const c10::OperatorHandle& op, const std::optional<c10::OperatorHandle>& out_op,
                     const OpPolicy& policy, Launch& launch) {
  auto guard = below_autograd();
  c10::AutoGradMode grad_mode(launch.grad_enabled);
  SharedHostStorages shared;
  static DropWarnings drop;
  c10::WarningUtils::WarningHandlerGuard quiet(&drop);
  launch.task_args.make();
  torch::jit::Stack& s = launch.task_args.values;  // in place: the record keeps its capacity
  if (out_op)
    run_out_variant(*out_op, policy, launch.outputs, s);
  else
    run_functional(op, policy, launch, s);
}

void return_results(torch::jit::Stack* stack, size_t n, c10::SmallVector<c10::IValue, 4>& results) {
  torch::jit::drop(*stack, n);
  for (auto& v : results) stack->push_back(std::move(v));
}

} // namespace

// A queued call's five jobs: the written arguments' metadata, the results'
// device memory, the task's arguments, the offer to adaptive eager, and the
// task queued on the stream.
void launch_queued(const c10::OperatorHandle& op, const OpPolicy& policy, torch::jit::Stack* stack,
                   c10::DeviceIndex device, const std::vector<c10::IValue>& meta,
                   const std::vector<at::Tensor>& meta_written) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size(), r = schema.returns().size();
  auto args = torch::jit::last(*stack, n);
  LaunchRef launch;
  adopt_written_metadata(op, policy, args, meta_written, *launch);
  launch->grad_enabled = at::GradMode::is_enabled();
  TaskValues &task_args = launch->task_args, &outputs = launch->outputs;
  c10::SmallVector<c10::IValue, 4> results(r);
  outputs.values.reserve(r);
  task_args.values.reserve(n + r);  // out= calls push their outputs onto it
  const int64_t fusable = min_fusable_numel();
  bool large = allocate_results(policy, args, meta, device, fusable, results, outputs);
  large |= take_task_args(policy, args, device, fusable, task_args);

  // A functional op whose out= overload exists writes straight into its
  // outputs; otherwise its results are copied into them.
  bool all_defined = true;
  for (size_t i = 0; i < r; ++i)
    all_defined &= policy.source[i] >= 0 || (results[i].isTensor() && results[i].toTensor().defined());
  const bool all_fresh = all_defined && outputs.values.size() == r && r > 0;
  auto out_op = all_fresh ? policy.out_op : std::nullopt;
  rt::Stream& stream = current_runtime_stream(device);
  if (policy.fusion != Fusion::None && large && all_defined && launch->grown_out.empty() && adaptive_eager_enabled() &&
      offered_to_fusion(op, out_op, policy, *launch, stream))
    return return_results(stack, n, results);
  if (!out_op && all_fresh && policy.equivalent_out && policy.equivalent_out->applies(args)) {
    out_op = policy.equivalent_out->out_op;
    const auto& extra = policy.equivalent_out->extra_args;
    task_args.values.insert(task_args.values.end(), extra.begin(), extra.end());
  }
  translate_errors([&] {
    stream.enqueue(rt::TaskName::borrow(policy.task_name),  // policies live as long as the process
                   [op, out_op, &policy, launch = std::move(launch)] { run_queued_task(op, out_op, policy, *launch); });
  });
  return_results(stack, n, results);
}

namespace {

// write_from_host for a kernel's result `src`, which the task then owns; the
// result may be expanded (copy_result).
void write_result(rt::Stream& stream, const at::Tensor& dst, const at::Tensor& src) {
  if (stream.query()) {
    memcheck::HostAccess access;
    copy_result(host_view(dst), src);
    return;
  }
  translate_errors([&] {
    stream.enqueue("aten::copy_", [dst = host_view(dst), src]() mutable {
      auto guard = below_autograd();
      copy_result(dst, src);
    });
  });
}

} // namespace

void run_synchronously(const c10::OperatorHandle& op, const OpPolicy& policy, torch::jit::Stack* stack,
                       c10::DeviceIndex device) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size(), r = schema.returns().size();
  translate_errors([&] { current_runtime_stream(device).synchronize(); });
  memcheck::HostAccess access;
  std::vector<c10::IValue> originals(stack->end() - n, stack->end());
  SharedHostStorages shared;
  // One host view per device tensor, however many arguments pass it: ATen's
  // checks compare tensors themselves (x[[]] = x overlaps itself even when
  // empty), and a resizable one if any of them is written.
  auto same_tensor = [&](size_t i, size_t j) {
    return originals[i].isTensor() && originals[j].isTensor() && originals[i].toTensor().defined() &&
           originals[i].toTensor().is_same(originals[j].toTensor());
  };
  for (size_t i = 0; i < n; ++i) {
    auto& slot = (*stack)[stack->size() - n + i];
    size_t first = 0;
    while (first < i && !same_tensor(first, i)) ++first;
    if (first < i) {
      slot = (*stack)[stack->size() - n + first];
      continue;
    }
    bool resizable = policy.writes(i);
    for (size_t k = i + 1; k < n; ++k) resizable |= same_tensor(i, k) && policy.writes(k);
    slot = task_arg(originals[i], i, policy, device, false, resizable);
  }
  std::vector<c10::IValue> views(stack->end() - n, stack->end());
  // Written arguments the kernel resized come back (into device memory, if
  // it grew them into fresh host memory), also when it then raised: a CPU
  // kernel may resize its out= before it refuses the call.
  auto written_come_back = [&] {
    for (size_t i : policy.written) {
      if (!originals[i].isTensor()) continue;
      const at::Tensor& d = originals[i].toTensor();
      const at::Tensor& a = views[i].toTensor();
      adopt_metadata(d, a);
      if (a.storage().data() != d.storage().data()) {
        translate_errors([&] { current_runtime_stream(device).synchronize(); });
        // The memory checker's check of the fresh block, which waited for the stream, runs before
        // the host writes it (another thread's work may have kept the stream busy until now).
        memcheck::HostAccess settled;
        host_view(d).copy_(a);
      }
    }
  };
  try {
    auto guard = below_autograd();
    call_kernel(op, policy, stack);
  } catch (...) {
    written_come_back();
    throw;
  }
  written_come_back();
  for (size_t i = 0; i < r; ++i) {
    auto& ret = (*stack)[stack->size() - r + i];
    if (policy.source[i] >= 0) {
      ret = originals[policy.source[i]];
      continue;
    }
    ret = map_tensors(ret, [&](const at::Tensor& t) {
      if (!t.defined() || !t.is_cpu()) return t;
      at::Tensor d = empty_like_on(t, device);
      write_result(current_runtime_stream(device), d, t);
      return d;
    });
  }
}

void write_from_host(rt::Stream& stream, const at::Tensor& dst, const at::Tensor& src, bool owned) {
  if (stream.query()) {
    memcheck::HostAccess access;  // and what the memory checker owes the stream that went idle
    host_view(dst).copy_(src);
    return;
  }
  enqueue_copy(stream, host_view(dst), owned ? src : src.clone(at::MemoryFormat::Preserve));
}

void enqueue_copy(rt::Stream& stream, at::Tensor dst, at::Tensor src) {
  translate_errors([&] {
    stream.enqueue("aten::copy_", [dst = std::move(dst), src = std::move(src)]() mutable {
      auto guard = below_autograd();
      dst.copy_(src);
    });
  });
}

void adopt_metadata(const at::Tensor& d, const at::Tensor& m) {
  if (d.sizes() == m.sizes() && d.strides() == m.strides() && d.storage_offset() == m.storage_offset()) return;
  size_t needed = at::detail::computeStorageNbytes(m.sizes(), m.strides(), d.itemsize(), m.storage_offset());
  if (needed > d.storage().nbytes()) resize_storage_bytes(d.storage(), needed);
  d.unsafeGetTensorImpl()->set_sizes_and_strides(m.sizes(), m.strides(), m.storage_offset());
  memcheck::named(d);
}

void call_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) { call_kernel(op, op_policy(op), stack); }

void call_kernel(const c10::OperatorHandle& op, const OpPolicy& policy, torch::jit::Stack* stack) {
  follow_host_thread_count();
  switch (policy.device_op) {
    case DeviceOp::Tanh:
      if (device_ops::tanh(op, stack)) return;
      break;
    case DeviceOp::None:
      break;
  }
  op.callBoxed(stack);
}

} // namespace torchneuron
