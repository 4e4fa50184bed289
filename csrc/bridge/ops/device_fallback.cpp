// The generic device executor: how every ATen operator without an explicit
// kernel runs on `neuron`.
//
//   view ops      metadata only: the CPU view kernel runs on a host alias and
//                 its result is re-expressed over the device storage
//   other ops     the host computes output metadata with the op's meta kernel
//                 (meta aliases of the arguments), allocates outputs from the
//                 caching allocator, queues a task on the current stream and
//                 returns. The task runs ATen's CPU kernel (or the device's
//                 own: own_kernels.h) on host aliases of device memory: no
//                 copies. The meta pass runs once per argument signature
//                 (meta_cache.h); structured ops call their out= overload
//                 (out_variants.h); element-wise ops may join a pending fused
//                 task (../fusion/elementwise_fusion.h).
//   synchronizing ops whose outputs depend on data, or that return values
//                 (nonzero, unique, equal, ...): the host waits for the stream
//                 and runs the kernel in place
//   fallback      an op without a meta kernel runs the same synchronous way;
//                 it is counted and warned about (op_tracking.h)
//   verified      ops with several tensor results: some meta kernels describe
//                 auxiliary results differently from the CPU kernel (batch
//                 norm's saved statistics in eval mode, embedding_bag's
//                 offset2bag, layer norm's mean dtype). The first call with a
//                 given argument signature (dtypes, ranks, flags, modes) runs
//                 synchronously and its results are checked against the meta
//                 pass; signatures that agree are queued from then on, those
//                 that disagree keep running synchronously, with the CPU
//                 kernel's own metadata.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/flat_hash_map.h>

#include <array>
#include <mutex>
#include <unordered_set>
#include <utility>

#include "../device_state.h"
#include "../generator.h"
#include "../op_tracking.h"
#include "storage_resize.h"
#include "aliases.h"
#include "kernels.h"
#include "meta_cache.h"
#include "own_kernels.h"
#include "out_variants.h"
#include "result_placement.h"
#include "../fusion/elementwise_fusion.h"

namespace torchneuron::ops {
namespace {

// Operators whose outputs depend on the values of their inputs; they wait for
// the stream on every accelerator.
const std::unordered_set<std::string> kDataDependent = {
    "aten::nonzero", "aten::nonzero_numpy", "aten::argwhere", "aten::masked_select", "aten::unique_dim",
    "aten::_unique", "aten::_unique2", "aten::unique_consecutive", "aten::unique_dim_consecutive",
    "aten::repeat_interleave", "aten::bincount", "aten::_local_scalar_dense", "aten::equal", "aten::is_nonzero",
    "aten::_assert_async", "aten::segment_reduce", "aten::histogram", "aten::histogramdd",
    "aten::_histogramdd_bin_edges", "aten::_histogramdd_from_bin_cts", "aten::_histogramdd_from_bin_tensors"};

// Operators that take index tensors on the host (as CUDA allows).
const std::unordered_set<std::string> kHostIndices = {
    "aten::index", "aten::index_put_", "aten::_index_put_impl_", "aten::index_put", "aten::_unsafe_index",
    "aten::_unsafe_index_put", "aten::_pack_padded_sequence", "aten::_pad_packed_sequence"};

// Warnings of a queued task are dropped: the host-side meta pass of the same
// call already ran the checks that warn, and an executor thread has no Python
// frame to attribute a warning to.
struct DropWarnings final : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

bool is_tensor_type(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::TensorType) return true;
  if (auto o = t->cast<c10::OptionalType>()) return is_tensor_type(o->getElementType());
  if (auto l = t->cast<c10::ListType>()) return is_tensor_type(l->getElementType());
  return false;
}

const c10::AliasInfo* alias_of(const c10::Argument& a) {
  const c10::AliasInfo* info = a.alias_info();
  if (info && info->beforeSets().empty() && !info->containedTypes().empty()) return &info->containedTypes()[0];
  return info;
}

struct OpTraits {
  std::vector<size_t> written;   // arguments the op writes (Tensor(a!))
  std::vector<int> source;       // per return: the argument it aliases, or -1
  bool is_view = false;          // returns alias inputs without writes
  bool tensor_returns = true;    // every return is a tensor (or list of them)
  bool data_dependent = false;
  bool host_indices = false;
  std::vector<size_t> generators;
  std::vector<bool> is_tensor_list;  // per argument: Tensor[] or Tensor?[]
  // Output metadata cannot depend on a floating-point argument's value: the
  // op returns nothing, or only `self`, updated in place. Such values (a
  // learning rate, AdamW's bias corrections) then stay out of the meta
  // cache's key, so a value that changes every step does not rerun the meta
  // kernel every step.
  bool float_values_free = false;
  std::atomic<bool> no_meta{false};
  bool verify_meta = false;      // several tensor results: check meta once per signature
  std::mutex verdict_mu;
  std::unordered_map<uint64_t, bool> meta_agrees;  // signature -> verdict
  std::string task_name;         // "aten::add.Tensor", for errors and the profiler
  bool fusable = false;          // a candidate for adaptive-eager fusion
  bool place_results = false;    // the kernel may compute into device memory (result_placement.h)
  std::unique_ptr<PlacementHistory> placement_history;  // with place_results: learned by its calls
  std::optional<c10::OperatorHandle> out_op;  // the out= overload of a functional op
  std::optional<EquivalentOutCall> equivalent_out;  // without out_op: another op's out= that computes the same
  OpCounter* counter = nullptr;  // this op's slot in op tracking
};

OpTraits& make_traits(const c10::OperatorHandle& op) {
  static std::mutex mu;
  static ska::flat_hash_map<const c10::FunctionSchema*, std::unique_ptr<OpTraits>> cache;
  const auto& schema = op.schema();
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[&schema];
  if (slot) return *slot;
  slot = std::make_unique<OpTraits>();
  OpTraits& t = *slot;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    auto* a = alias_of(args[i]);
    if (a && a->isWrite()) t.written.push_back(i);
    auto kind = args[i].type()->kind();
    if (kind == c10::TypeKind::GeneratorType ||
        (kind == c10::TypeKind::OptionalType &&
         args[i].type()->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType))
      t.generators.push_back(i);
    const auto list = args[i].type()->cast<c10::ListType>();
    t.is_tensor_list.push_back(list && is_tensor_type(list->getElementType()));
  }
  size_t tensor_results = 0;
  for (const auto& r : schema.returns()) {
    t.tensor_returns &= is_tensor_type(r.type());
    if (!alias_of(r)) tensor_results += r.type()->kind() == c10::TypeKind::TensorType ? 1 : 2;
    int src = -1;
    if (auto* ra = alias_of(r)) {
      for (size_t i = 0; i < args.size() && src < 0; ++i)
        if (auto* aa = alias_of(args[i]); aa && aa->beforeSets() == ra->beforeSets()) src = static_cast<int>(i);
      if (!ra->isWrite()) t.is_view = true;
    }
    t.source.push_back(src);
  }
  // (Random ops check their distribution's parameters in the meta kernel:
  // those keep their values keyed, so a bad one raises at the call.)
  const bool updates_self = !t.written.empty() && t.written[0] == 0 && !args[0].kwarg_only();
  t.float_values_free = t.generators.empty() && (t.source.empty() || updates_self) &&
                        std::all_of(t.source.begin(), t.source.end(), [](int src) { return src == 0; });
  const std::string& name = schema.name();
  t.data_dependent = kDataDependent.count(name) > 0;
  t.host_indices = kHostIndices.count(name) > 0;
  t.verify_meta = tensor_results > 1;
  t.task_name = schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
  t.fusable = is_fusable(schema);
  t.place_results = places_results(name);
  if (t.place_results) t.placement_history = std::make_unique<PlacementHistory>();
  t.out_op = out_variant_of(op);
  if (!t.out_op) t.equivalent_out = equivalent_out_call(op);
  t.counter = &op_counter(schema.operator_name());
  return t;
}

// Traits live as long as the process, so each thread keeps a direct-mapped
// table of the operators it called recently: a hit costs no lock and no hash.
OpTraits& traits_for(const c10::OperatorHandle& op) {
  struct Recent {
    const c10::FunctionSchema* schema = nullptr;
    OpTraits* traits = nullptr;
  };
  static thread_local std::array<Recent, 256> recent;
  const c10::FunctionSchema* schema = &op.schema();
  // Fibonacci hashing: schemas sit at a fixed offset in large, similarly
  // aligned objects, so their low bits say little.
  Recent& r = recent[(reinterpret_cast<uintptr_t>(schema) * 0x9E3779B97F4A7C15ull) >> 56];
  if (r.schema != schema) r = {schema, &make_traits(op)};
  return *r.traits;
}

// What can make a meta kernel and the CPU kernel disagree on result metadata:
// dtypes, ranks, empty or absent tensors, flags, modes, strings. Sizes are
// left out so that shape-varying workloads do not re-verify.
uint64_t signature_of(c10::ArrayRef<c10::IValue> args) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  auto tensor = [&](const at::Tensor& t) {
    mix(t.defined() ? 1 + 8 * (static_cast<uint64_t>(t.scalar_type()) + 64 * (t.dim() + 64 * (t.numel() == 0))) : 0);
  };
  for (const auto& a : args) {
    mix(a.isNone() ? 17 : 19);
    if (a.isTensor()) tensor(a.toTensor());
    else if (a.isBool()) mix(a.toBool() ? 3 : 5);
    else if (a.isInt()) mix(static_cast<uint64_t>(a.toInt()) * 7 + 11);
    else if (a.isString()) mix(std::hash<std::string>()(a.toStringRef()));
    else if (a.isTensorList()) { mix(a.toTensorList().size()); for (const at::Tensor& t : a.toTensorList()) tensor(t); }
    else if (a.isList()) { for (const c10::IValue& e : a.toList()) if (e.isTensor()) tensor(e.toTensor()); else mix(e.isNone()); }
  }
  return h;
}

// Whether the device results of a synchronous run have the metadata the meta
// pass predicted (sizes, dtype) for every freshly allocated result.
bool results_match_meta(const OpTraits& traits, c10::ArrayRef<c10::IValue> results, c10::ArrayRef<c10::IValue> meta) {
  for (size_t i = 0; i < results.size(); ++i) {
    if (traits.source[i] >= 0) continue;
    std::vector<at::Tensor> a, b;
    for_each_tensor(results[i], [&](const at::Tensor& t) { a.push_back(t); });
    for_each_tensor(meta[i], [&](const at::Tensor& t) { b.push_back(t); });
    if (a.size() != b.size()) return false;
    for (size_t k = 0; k < a.size(); ++k) {
      if (a[k].defined() != b[k].defined()) return false;
      if (a[k].defined() && (a[k].sizes() != b[k].sizes() || a[k].scalar_type() != b[k].scalar_type())) return false;
    }
  }
  return true;
}

bool is_generator_arg(const OpTraits& t, size_t i) {
  return std::find(t.generators.begin(), t.generators.end(), i) != t.generators.end();
}

// The one device every neuron tensor of the call is on (or a neuron Device
// argument's, for factories); raises PyTorch's usual error for mixed devices.
c10::DeviceIndex device_of_call(c10::ArrayRef<c10::IValue> args, const OpTraits& traits) {
  c10::DeviceIndex device = -1;
  std::optional<c10::Device> other;
  for (const auto& a : args) {
    for_each_tensor(a, [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (t.device().type() == kNeuron) {
        if (device < 0) device = t.device().index();
        else if (t.device().index() != device) other = t.device();
      } else if (!(t.is_cpu() && (t.dim() == 0 || traits.host_indices))) {
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

c10::IValue to_device_arg(const c10::IValue& a, c10::DeviceType type) {
  if (a.isDevice() && a.toDevice().type() == kNeuron) return c10::Device(type);
  return a;
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

// Makes device tensor `d` take the metadata `m` computed for it (an out=
// argument resized by the op, or an in-place metadata change).
void adopt_metadata(const at::Tensor& d, const at::Tensor& m) {
  if (d.sizes() == m.sizes() && d.strides() == m.strides() && d.storage_offset() == m.storage_offset()) return;
  size_t needed = at::detail::computeStorageNbytes(m.sizes(), m.strides(), d.itemsize(), m.storage_offset());
  if (needed > d.storage().nbytes()) resize_storage_bytes(d.storage(), needed);
  d.unsafeGetTensorImpl()->set_sizes_and_strides(m.sizes(), m.strides(), m.storage_offset());
}

void run_view(const c10::OperatorHandle& op, const OpTraits& traits, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  std::vector<c10::IValue> originals(stack->end() - n, stack->end());
  for (auto it = stack->end() - n; it != stack->end(); ++it)
    *it = map_tensors(*it, [](const at::Tensor& t) { return host_alias(t); });
  {
    auto guard = below_autograd();
    op.callBoxed(stack);
  }
  const size_t r = op.schema().returns().size();
  for (size_t i = 0; i < r; ++i) {
    auto& ret = (*stack)[stack->size() - r + i];
    int src = traits.source[i];
    TORCH_INTERNAL_ASSERT(src >= 0 && originals[src].isTensor(), "neuron: unsupported view op ", op.schema());
    const at::Tensor& base = originals[src].toTensor();
    ret = map_tensors(ret, [&](const at::Tensor& t) { return device_view(base, t); });
  }
}

// A host tensor argument as a device task sees it: a snapshot taken at the
// launch, as a copy to the device would be.
at::Tensor snapshot(const at::Tensor& host_tensor) {
  auto copy = host_tensor.clone();
  if (host_tensor.unsafeGetTensorImpl()->is_wrapped_number()) copy.unsafeGetTensorImpl()->set_wrapped_number(true);
  return copy;
}

// Host-side form of an argument for a device task: device tensors become
// aliases; host tensors (scalars, indices) are snapshotted now, as a copy to
// the device at launch would; generators become this op's claimed engine.
c10::IValue task_arg(const c10::IValue& a, size_t i, const OpTraits& traits, c10::DeviceIndex device,
                     bool snapshot_host, bool resizable) {
  if (is_generator_arg(traits, i))
    return claim_engine(a.isNone() ? std::nullopt : std::optional<at::Generator>(a.toGenerator()), device);
  if (a.isDevice()) return to_device_arg(a, c10::kCPU);
  return map_tensors(a, [&](const at::Tensor& t) {
    if (!t.defined()) return t;
    if (t.device().type() == kNeuron) return host_alias(t, resizable);
    return snapshot_host ? snapshot(t) : t;
  });
}

// Computes outputs on Meta; returns false if the op has no usable meta kernel.
// Why a meta pass failed: the op has no meta kernel, the outputs depend on the
// data for these inputs (a boolean mask index, ...), or something else (a
// meta kernel stricter than the CPU kernel, or a genuine user error that the
// CPU kernel will then raise).
enum class MetaFailure { None, NoMetaKernel, DataDependent, Other };

MetaFailure run_meta(const c10::OperatorHandle& op, OpTraits& traits, c10::ArrayRef<c10::IValue> args,
                     std::shared_ptr<const MetaResult>& result) {
  // The key is built in per-thread scratch whose words keep their capacity:
  // a hit allocates nothing.
  static thread_local MetaSignature scratch;
  const bool cacheable = meta_signature(op, args, traits.generators, traits.float_values_free, scratch);
  if (cacheable) {
    if ((result = meta_cache_find(scratch))) return MetaFailure::None;
  }
  MetaSignature sig;  // the meta kernel may reach this thread's scratch again
  if (cacheable) sig = scratch;
  torch::jit::Stack meta;
  std::vector<at::Tensor> meta_written;
  for (size_t i = 0; i < args.size(); ++i) {
    if (is_generator_arg(traits, i)) {
      meta.emplace_back();
      continue;
    }
    // CPU scalars stay on the CPU, as kernels (and Python meta functions)
    // expect them next to device tensors.
    meta.push_back(map_tensors(to_device_arg(args[i], c10::kMeta), [](const at::Tensor& t) {
      return t.defined() && t.is_cpu() && t.dim() == 0 ? t : meta_alias(t);
    }));
  }
  for (size_t i : traits.written)
    meta_written.push_back(meta[i].isTensor() ? meta[i].toTensor() : at::Tensor());
  std::string what;
  try {
    auto guard = below_autograd();
    op.callBoxed(&meta);
    result = std::make_shared<const MetaResult>(MetaResult{std::move(meta), std::move(meta_written)});
    if (cacheable) meta_cache_insert(std::move(sig), result);
    return MetaFailure::None;
  } catch (const std::exception& e) {
    what = e.what();
  }
  if (std::getenv("TORCHNEURON_DEBUG_META"))
    std::fprintf(stderr, "[torchneuron] meta pass of %s failed: %s\n", op.schema().name().c_str(), what.c_str());
  if (what.find("data-independent") != std::string::npos || what.find("data-dependent") != std::string::npos ||
      what.find("DynamicOutputShape") != std::string::npos)
    return MetaFailure::DataDependent;
  // Only a missing Meta kernel is a property of the op; other refusals may
  // depend on the inputs.
  if (what.find("'Meta' backend") != std::string::npos) {
    traits.no_meta = true;
    return MetaFailure::NoMetaKernel;
  }
  return MetaFailure::Other;
}

// What a queued task gets: host values now, device tensors as metadata only
// (DeferredAlias: the task makes their aliases when it runs), whether they
// are arguments of their own or elements of a Tensor[] / Tensor?[] list.
struct TaskValues {
  struct Deferred {
    size_t index = 0;     // into values
    int64_t element = -1; // the list element it fills, or -1 for values[index] itself
    DeferredAlias alias;
  };
  std::vector<c10::IValue> values;
  c10::SmallVector<Deferred, 3> deferred;

  void add(const at::Tensor& device_tensor) {
    defer(values.size(), -1, device_tensor);
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
      c10::List<std::optional<at::Tensor>> tensors = list.toOptionalTensorList(), copy;
      copy.reserve(tensors.size());
      for (size_t k = 0; k < tensors.size(); ++k) {
        std::optional<at::Tensor> t = tensors[k];
        copy.push_back(t ? std::optional<at::Tensor>(element(*t, static_cast<int64_t>(k))) : std::nullopt);
      }
      values.emplace_back(std::move(copy));
    }
  }
  void make(bool resizable = false) {
    for (const auto& d : deferred) {
      if (d.element < 0) values[d.index] = d.alias.make(resizable);
      else values[d.index].toList().set(d.element, d.alias.make(resizable));
    }
    deferred.clear();
  }

 private:
  void defer(size_t index, int64_t element, const at::Tensor& device_tensor) {
    auto& d = deferred.emplace_back();  // in place: a DeferredAlias is large to move
    d.index = index;
    d.element = element;
    d.alias.assign(device_tensor);
  }
};

// Everything one queued call hands its task. The host fills it and the
// executor releases it: glibc's per-thread caches serve such cross-thread
// pairs only through the locked arena, at hundreds of instructions a block,
// so records are recycled instead, vectors keeping their capacity.
struct Launch {
  TaskValues task_args, outputs;
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
    }
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

 private:
  Launch* p_;
};

void run_queued(const c10::OperatorHandle& op, const OpTraits& traits, torch::jit::Stack* stack,
                c10::DeviceIndex device, const std::vector<c10::IValue>& meta,
                const std::vector<at::Tensor>& meta_written) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size(), r = schema.returns().size();
  auto args = torch::jit::last(*stack, n);
  for (size_t k = 0; k < traits.written.size(); ++k)
    if (meta_written[k].defined()) adopt_metadata(args[traits.written[k]].toTensor(), meta_written[k]);

  LaunchRef launch;
  TaskValues &task_args = launch->task_args, &outputs = launch->outputs;
  c10::SmallVector<c10::IValue, 4> results(r);
  outputs.values.reserve(r);
  task_args.values.reserve(n + r);  // out= calls push their outputs onto it
  bool large = false;  // worth fusing
  const int64_t fusable = min_fusable_numel();
  auto note = [&](const c10::IValue& v) { large |= v.isTensor() && v.toTensor().numel() >= fusable; };
  for (size_t i = 0; i < r; ++i) {
    if (traits.source[i] >= 0) {
      results[i] = args[traits.source[i]];
    } else {
      auto empty_like = [&](const at::Tensor& m) { return m.defined() ? empty_like_on(m, device) : m; };
      results[i] = meta[i].isTensor() ? c10::IValue(empty_like(meta[i].toTensor())) : map_tensors(meta[i], empty_like);
      note(results[i]);
      if (results[i].isTensor() && results[i].toTensor().defined())
        outputs.add(results[i].toTensor());
      else
        outputs.values.push_back(map_tensors(results[i], [](const at::Tensor& t) { return host_alias(t); }));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    note(args[i]);
    const bool device_tensor =
        args[i].isTensor() && args[i].toTensor().defined() && args[i].toTensor().device().type() == kNeuron;
    if (device_tensor && !is_generator_arg(traits, i))
      task_args.add(args[i].toTensor());
    else if (traits.is_tensor_list[i] && args[i].isList())
      task_args.add_list(args[i]);
    else
      task_args.values.push_back(task_arg(args[i], i, traits, device, true, false));
  }

  // A functional op whose out= overload exists writes straight into its
  // outputs; otherwise its results are copied into them.
  bool all_defined = true;
  for (size_t i = 0; i < r; ++i)
    all_defined &= traits.source[i] >= 0 || (results[i].isTensor() && results[i].toTensor().defined());
  const size_t fresh = outputs.values.size();
  auto out_op = all_defined && fresh == r && r > 0 ? traits.out_op : std::nullopt;
  rt::Stream& stream = current_runtime_stream(device);
  if (traits.fusable && large && all_defined && adaptive_eager_enabled()) {
    task_args.make();
    outputs.make();
    ElementwiseCall call{out_op ? *out_op : op, task_args.values, {}, traits.task_name};
    if (out_op)
      call.args.insert(call.args.end(), outputs.values.begin(), outputs.values.end());
    else
      for (const auto& o : outputs.values) call.results.push_back(o.toTensor());
    if (translate_errors([&] { return enqueue_fusable(stream, call); })) {
      torch::jit::drop(*stack, n);
      for (auto& v : results) stack->push_back(std::move(v));
      return;
    }
  }
  if (!out_op && all_defined && fresh == r && r > 0 && traits.equivalent_out && traits.equivalent_out->applies(args)) {
    out_op = traits.equivalent_out->out_op;
    const auto& extra = traits.equivalent_out->extra_args;
    task_args.values.insert(task_args.values.end(), extra.begin(), extra.end());
  }
  translate_errors([&] {
    stream.enqueue(
        rt::TaskName::borrow(traits.task_name),  // traits live as long as the process
        [op, out_op, &traits, launch = std::move(launch)] {
          TaskValues &task_args = launch->task_args, &outputs = launch->outputs;
          auto guard = below_autograd();
          static DropWarnings drop;
          c10::WarningUtils::WarningHandlerGuard quiet(&drop);
          task_args.make();
          torch::jit::Stack& s = task_args.values;  // in place: the record keeps its capacity
          if (out_op) {
            // Some out= kernels resize their output as scratch (mse_loss.out):
            // they get resizable aliases, and results that moved come back.
            std::vector<at::Tensor> flexible;
            for (auto& o : outputs.values)
              flexible.push_back(o.isTensor() ? host_alias(o.toTensor(), /*resizable=*/true) : at::Tensor());
            for (const auto& d : outputs.deferred) flexible[d.index] = d.alias.make(/*resizable=*/true);
            for (auto& f : flexible) s.push_back(f);
            call_kernel(*out_op, &s);
            for (const auto& d : outputs.deferred)
              if (flexible[d.index].storage().data() != d.alias.data) d.alias.make().copy_(flexible[d.index]);
            return;
          }
          outputs.make();
          PlaceResults placing(outputs.values, traits.place_results, traits.placement_history.get(), s);
          call_kernel(op, &s);
          std::vector<c10::IValue> results;
          for (size_t i = 0; i < s.size(); ++i)
            if (traits.source[i] < 0) results.push_back(std::move(s[i]));
          s.clear();
          placing.settle(std::move(results));
        });
  });
  torch::jit::drop(*stack, n);
  for (auto& v : results) stack->push_back(std::move(v));
}

void run_synchronously(const c10::OperatorHandle& op, const OpTraits& traits, torch::jit::Stack* stack,
                       c10::DeviceIndex device) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size(), r = schema.returns().size();
  translate_errors([&] { current_runtime_stream(device).synchronize(); });
  std::vector<c10::IValue> originals(stack->end() - n, stack->end());
  for (size_t i = 0; i < n; ++i) {
    bool written = std::find(traits.written.begin(), traits.written.end(), i) != traits.written.end();
    (*stack)[stack->size() - n + i] = task_arg(originals[i], i, traits, device, false, written);
  }
  std::vector<c10::IValue> aliases(stack->end() - n, stack->end());
  {
    auto guard = below_autograd();
    call_kernel(op, stack);
  }
  // Written arguments the kernel resized into fresh host memory come back.
  for (size_t i : traits.written) {
    if (!originals[i].isTensor()) continue;
    const at::Tensor& d = originals[i].toTensor();
    const at::Tensor& a = aliases[i].toTensor();
    if (a.storage().data() != d.storage().data()) {
      adopt_metadata(d, a);
      translate_errors([&] { current_runtime_stream(device).synchronize(); });
      host_alias(d).copy_(a);
    } else {
      adopt_metadata(d, a);
    }
  }
  for (size_t i = 0; i < r; ++i) {
    auto& ret = (*stack)[stack->size() - r + i];
    if (traits.source[i] >= 0) {
      ret = originals[traits.source[i]];
      continue;
    }
    ret = map_tensors(ret, [&](const at::Tensor& t) {
      if (!t.defined() || !t.is_cpu()) return t;
      at::Tensor d = empty_like_on(t, device);
      host_alias(d).copy_(t);
      return d;
    });
  }
}

} // namespace

void device_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpTraits& traits = traits_for(op);
  const auto& schema = op.schema();
  auto args = torch::jit::last(*stack, schema.arguments().size());
  const c10::DeviceIndex device = device_of_call(args, traits);
  std::optional<c10::DeviceGuard> guard;  // a guard's virtual calls only when the device changes
  if (current_device() != device) guard.emplace(c10::Device(kNeuron, device));

  if (traits.is_view) {
    record_execution(*traits.counter, Execution::Queued);
    return run_view(op, traits, stack);
  }
  MetaFailure failure = MetaFailure::NoMetaKernel;
  if (traits.tensor_returns && !traits.data_dependent && !traits.no_meta) {
    std::shared_ptr<const MetaResult> predicted;
    failure = run_meta(op, traits, args, predicted);
    if (failure == MetaFailure::None) {
      const std::vector<c10::IValue>& meta = predicted->returns;
      const std::vector<at::Tensor>& meta_written = predicted->written;
      if (!traits.verify_meta || predicted->observed) {
        record_execution(*traits.counter, Execution::Queued);
        return run_queued(op, traits, stack, device, meta, meta_written);
      }
      const uint64_t sig = signature_of(args);
      std::optional<bool> agrees;
      {
        std::lock_guard<std::mutex> lock(traits.verdict_mu);
        if (auto it = traits.meta_agrees.find(sig); it != traits.meta_agrees.end()) agrees = it->second;
      }
      if (agrees.value_or(false)) {
        record_execution(*traits.counter, Execution::Queued);
        return run_queued(op, traits, stack, device, meta, meta_written);
      }
      // Unverified or known to disagree: the CPU kernel decides the metadata,
      // and where the meta kernel got it wrong, what the CPU kernel did
      // becomes the meta result for these exact arguments, so the next such
      // call queues (batch norm in eval mode returns empty statistics).
      MetaSignature full;  // before the call: it may change its arguments' metadata
      const bool keyed = meta_signature(op, args, traits.generators, traits.float_values_free, full);
      run_synchronously(op, traits, stack, device);
      const size_t r = schema.returns().size();
      const bool ok = results_match_meta(traits, torch::jit::last(*stack, r), torch::jit::last(meta, r));
      if (!agrees) {
        std::lock_guard<std::mutex> lock(traits.verdict_mu);
        traits.meta_agrees[sig] = ok;
      }
      if (!ok && keyed) {
        MetaResult seen{{}, meta_written, true};
        for (size_t i = 0; i < r; ++i)
          seen.returns.push_back(traits.source[i] >= 0 ? meta[i] : map_tensors((*stack)[stack->size() - r + i], [](const at::Tensor& t) {
            return meta_alias(t);
          }));
        meta_cache_insert(std::move(full), std::make_shared<const MetaResult>(std::move(seen)));
      }
      record_execution(*traits.counter, Execution::Synchronizing);
      return;
    }
  }
  const bool expected_sync = traits.data_dependent || !traits.tensor_returns || failure == MetaFailure::DataDependent;
  if (!expected_sync) {
    TORCH_CHECK_NOT_IMPLEMENTED(!strict_fallback(), "neuron: ", schema.operator_name(),
                                " cannot be queued (its output sizes are unknown before it runs) and "
                                "TORCHNEURON_STRICT_FALLBACK=1 forbids the synchronous fallback");
  }
  run_synchronously(op, traits, stack, device);
  if (!expected_sync && first_fallback(schema.operator_name()))
    TORCH_WARN("neuron: ", schema.operator_name(), " cannot be queued (its output sizes are unknown before ",
               "it runs), so it ran synchronously: the host waited for the device. It still ran on device ",
               "memory. See torchneuron.get_fallback_ops().");
  record_execution(*traits.counter, expected_sync ? Execution::Synchronizing : Execution::Fallback);
}

} // namespace torchneuron::ops
