#include "op_policy.h"

#include <c10/util/flat_hash_map.h>

#include <algorithm>
#include <array>

#include "../kernels/tanh.h"
#include "aten_meta.h"
#include "call_verdicts.h"
#include "result_placement.h"

namespace torchneuron {
namespace {

enum Trait : uint32_t {
  kDataDependent = 1 << 0,  // outputs depend on the values of the inputs: waits, on every accelerator
  kHostIndices = 1 << 1,    // index tensors may stay on the host
  kElementwise = 1 << 2,    // may join a fused group
  kRowwise = 1 << 3,        // reduces or normalises each row on its own: may close a fused group
  kPlaceResults = 1 << 4,   // functional CPU kernel without out=: computes into device memory
  kNoOutVariant = 1 << 5,   // its out= overload must not be used (see its rule)
  kCpuAlgorithm = 1 << 6,   // its composite picks an algorithm by device type: run the CPU's
  kQuantizedResult = 1 << 7,  // returns a quantized tensor, which neuron tensors cannot be: refused
  kSparseResult = 1 << 8,     // returns a sparse (or mkldnn) tensor, likewise
  kIndexPutChecks = 1 << 9,   // the CPU checks index and value shapes its meta kernel does not (meta_checks.h)
  kMultinomialChecks = 1 << 10,  // likewise the number of samples (meta_checks.h)
  kRunningStats = 1 << 11,  // batch norm: writes running_mean and running_var only when training
  kIndexOnDevice = 1 << 12,  // its `index` is never a CPU scalar operand (see its rule)
};

// One rule per operator. `op` is a base name, which covers every overload and
// the in-place form (`add` covers add.Tensor, add.out and add_.Tensor), or
// "name.overload" for one overload ("name.default": the unnamed one).
struct Rule {
  const char* op;
  uint32_t traits;
  ExactKind exact = ExactKind::None;
  DeviceOp device_op = DeviceOp::None;
};

using E = ExactKind;

const Rule kRules[] = {
    // Element-wise arithmetic, exact in fusion's loops.
    {"add", kElementwise, E::Add}, {"sub", kElementwise, E::Sub}, {"mul", kElementwise, E::Mul},
    {"div", kElementwise, E::Div}, {"neg", kElementwise, E::Neg}, {"abs", kElementwise, E::Abs},
    {"relu", kElementwise, E::Clamp}, {"clamp", kElementwise, E::Clamp}, {"clamp_min", kElementwise, E::Clamp},
    {"clamp_max", kElementwise, E::Clamp}, {"reciprocal", kElementwise, E::Reciprocal},
    // Element-wise functions fusion computes with ATen's own library calls.
    {"sigmoid", kElementwise, E::Function}, {"tanh", kElementwise, E::Function, DeviceOp::Tanh}, {"exp", kElementwise, E::Function},
    {"log", kElementwise, E::Function}, {"log2", kElementwise, E::Function}, {"log10", kElementwise, E::Function},
    {"sqrt", kElementwise, E::Function}, {"sin", kElementwise, E::Function}, {"cos", kElementwise, E::Function}, {"tan", kElementwise, E::Function},
    {"asin", kElementwise, E::Function}, {"acos", kElementwise, E::Function}, {"atan", kElementwise, E::Function}, {"erf", kElementwise, E::Function},
    {"erfc", kElementwise, E::Function},
    // Other element-wise operators: fused, run by ATen's kernels.
    {"rsqrt", kElementwise}, {"pow", kElementwise}, {"minimum", kElementwise}, {"maximum", kElementwise},
    {"where", kElementwise}, {"eq", kElementwise}, {"ne", kElementwise}, {"lt", kElementwise},
    {"le", kElementwise}, {"gt", kElementwise}, {"ge", kElementwise}, {"gelu", kElementwise},
    {"silu", kElementwise}, {"lerp", kElementwise}, {"addcmul", kElementwise}, {"addcdiv", kElementwise},
    {"fill", kElementwise}, {"sign", kElementwise}, {"floor", kElementwise}, {"ceil", kElementwise},
    {"trunc", kElementwise}, {"log1p", kElementwise}, {"expm1", kElementwise}, {"hardtanh", kElementwise},
    {"leaky_relu", kElementwise}, {"elu", kElementwise}, {"softplus", kElementwise}, {"threshold", kElementwise},
    {"threshold_backward", kElementwise}, {"sigmoid_backward", kElementwise}, {"tanh_backward", kElementwise},
    {"gelu_backward", kElementwise}, {"silu_backward", kElementwise}, {"logical_and", kElementwise},
    {"logical_or", kElementwise}, {"logical_not", kElementwise}, {"bitwise_and", kElementwise},
    {"bitwise_or", kElementwise}, {"square", kElementwise}, {"exp2", kElementwise},
    // Row-wise: the same arithmetic per row however many rows a call covers,
    // so pieces of whole rows reproduce one call over all of them.
    {"_softmax.default", kRowwise}, {"_log_softmax.default", kRowwise}, {"sum.dim_IntList", kRowwise},
    {"mean.dim", kRowwise}, {"amax.default", kRowwise}, {"amin.default", kRowwise},
    {"native_layer_norm.default", kRowwise | kPlaceResults},
    // Output sizes that depend on the data.
    {"nonzero", kDataDependent}, {"nonzero_numpy", kDataDependent}, {"argwhere", kDataDependent},
    {"masked_select", kDataDependent}, {"unique_dim", kDataDependent}, {"_unique", kDataDependent},
    {"_unique2", kDataDependent}, {"unique_consecutive", kDataDependent},
    {"unique_dim_consecutive", kDataDependent}, {"repeat_interleave", kDataDependent},
    {"bincount", kDataDependent}, {"_local_scalar_dense", kDataDependent}, {"equal", kDataDependent},
    {"is_nonzero", kDataDependent}, {"_assert_async", kDataDependent}, {"segment_reduce", kDataDependent},
    {"histogram", kDataDependent}, {"histogramdd", kDataDependent}, {"_histogramdd_bin_edges", kDataDependent},
    {"_histogramdd_from_bin_cts", kDataDependent}, {"_histogramdd_from_bin_tensors", kDataDependent},
    // Indices on the host.
    {"index", kHostIndices}, {"index_put", kHostIndices | kIndexPutChecks},
    {"_index_put_impl", kHostIndices | kIndexPutChecks}, {"_unsafe_index", kHostIndices},
    {"_unsafe_index_put", kHostIndices | kIndexPutChecks},
    {"_pack_padded_sequence", kHostIndices}, {"_pad_packed_sequence", kHostIndices},
    // The CPU checks the number of samples, its meta kernel does not.
    {"multinomial", kMultinomialChecks},
    // ATen's index_fill_ (CUDA's as well) iterates the index restrided to
    // self's rank, so even a zero-dimensional CPU index is no CPU scalar to
    // TensorIterator: CUDA refuses it.
    {"index_fill", kIndexOnDevice},
    // Results computed in device memory (result_placement.h).
    {"native_layer_norm", kPlaceResults}, {"native_layer_norm_backward", kPlaceResults},
    {"native_group_norm", kPlaceResults}, {"native_group_norm_backward", kPlaceResults},
    {"native_batch_norm", kPlaceResults | kRunningStats}, {"native_batch_norm_backward", kPlaceResults},
    {"_native_batch_norm_legit", kPlaceResults | kRunningStats}, {"_native_batch_norm_legit_no_training", kPlaceResults},
    {"embedding_dense_backward", kPlaceResults}, {"_embedding_bag", kPlaceResults},
    {"_embedding_bag_dense_backward", kPlaceResults}, {"index_select", kPlaceResults},
    {"_scaled_dot_product_flash_attention_for_cpu", kPlaceResults},
    {"_scaled_dot_product_flash_attention_for_cpu_backward", kPlaceResults},
    {"convolution", kPlaceResults | kCpuAlgorithm}, {"convolution_backward", kPlaceResults | kCpuAlgorithm},
    {"_convolution", kCpuAlgorithm}, {"_convolution_double_backward", kCpuAlgorithm},
    // The out= composite refuses devices other than the CPU, CUDA and XPU
    // before it reaches the CPU's mode kernel (the functional mode has one).
    {"mode.values", kCpuAlgorithm},
    // std::ldexp where the device has an ldexp kernel, self * pow(2, other) elsewhere.
    {"ldexp.Tensor", kCpuAlgorithm}, {"ldexp.out", kCpuAlgorithm}, {"ldexp_", kCpuAlgorithm},
    // The Python meta function gives its result the gradient's strides, and
    // the CPU out= kernel then writes a transposed gradient as if it were
    // contiguous; the functional kernel plus a copy is right for any strides.
    {"_log_softmax_backward_data", kPlaceResults | kNoOutVariant},
    // Layouts neuron tensors do not have: refused at the call, never given
    // dense metadata (meta kernels describe some of these results as dense).
    {"quantize_per_tensor", kQuantizedResult}, {"quantize_per_tensor_dynamic", kQuantizedResult},
    {"quantize_per_channel", kQuantizedResult}, {"_make_per_tensor_quantized_tensor", kQuantizedResult},
    {"_make_per_channel_quantized_tensor", kQuantizedResult}, {"to_sparse", kSparseResult},
    {"_to_sparse", kSparseResult}, {"to_sparse_csr", kSparseResult}, {"_to_sparse_csr", kSparseResult},
    {"to_sparse_csc", kSparseResult}, {"_to_sparse_csc", kSparseResult}, {"to_sparse_bsr", kSparseResult},
    {"_to_sparse_bsr", kSparseResult}, {"to_sparse_bsc", kSparseResult}, {"_to_sparse_bsc", kSparseResult},
    {"_sparse_coo_tensor_with_dims_and_tensors", kSparseResult}, {"_sparse_compressed_tensor_unsafe", kSparseResult},
    {"sparse_compressed_tensor", kSparseResult}, {"to_mkldnn", kSparseResult},
};

// The rules that apply to `schema`: its own overload's, then its base name's.
Rule rule_for(const c10::FunctionSchema& schema) {
  static const auto rules = [] {
    ska::flat_hash_map<std::string, const Rule*> m;
    for (const Rule& r : kRules)
      TORCH_INTERNAL_ASSERT(m.emplace(r.op, &r).second, "neuron: two operator rules for ", r.op);
    return m;
  }();
  Rule out{"", 0};
  const std::string& name = schema.name();
  if (name.rfind("aten::", 0) != 0) return out;
  std::string base = name.substr(6);
  const std::string overload = base + "." + (schema.overload_name().empty() ? "default" : schema.overload_name());
  if (!base.empty() && base.back() == '_') base.pop_back();  // in place
  for (const std::string& key : {overload, base}) {
    auto it = rules.find(key);
    if (it == rules.end()) continue;
    const Rule& r = *it->second;
    out.traits |= r.traits;
    if (out.exact == ExactKind::None) out.exact = r.exact;
    if (out.device_op == DeviceOp::None) out.device_op = r.device_op;
  }
  return out;
}

bool is_tensor_type(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::TensorType) return true;
  if (auto o = t->cast<c10::OptionalType>()) return is_tensor_type(o->getElementType());
  if (auto l = t->cast<c10::ListType>()) return is_tensor_type(l->getElementType());
  return false;
}

bool is_generator_type(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::GeneratorType) return true;
  auto o = t->cast<c10::OptionalType>();
  return o && o->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

const c10::AliasInfo* alias_of(const c10::Argument& a) {
  const c10::AliasInfo* info = a.alias_info();
  if (info && info->beforeSets().empty() && !info->containedTypes().empty()) return &info->containedTypes()[0];
  return info;
}

// What the schema says.
void read_schema(const c10::FunctionSchema& schema, OpPolicy& p) {
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    auto* a = alias_of(args[i]);
    if (a && a->isWrite()) p.written.push_back(i);
    if (is_generator_type(args[i].type())) p.generators.push_back(i);
    const auto list = args[i].type()->cast<c10::ListType>();
    p.is_tensor_list.push_back(list && is_tensor_type(list->getElementType()));
  }
  size_t tensor_results = 0;
  for (const auto& r : schema.returns()) {
    p.tensor_returns &= is_tensor_type(r.type());
    if (!alias_of(r)) tensor_results += r.type()->kind() == c10::TypeKind::TensorType ? 1 : 2;
    int src = -1;
    if (auto* ra = alias_of(r)) {
      for (size_t i = 0; i < args.size() && src < 0; ++i)
        if (auto* aa = alias_of(args[i]); aa && aa->beforeSets() == ra->beforeSets()) src = static_cast<int>(i);
      if (!ra->isWrite()) p.view = true;
    }
    p.source.push_back(src);
  }
  // (Random ops check their distribution's parameters in the meta kernel:
  // those keep their values keyed, so a bad one raises at the call.)
  const bool updates_self = !p.written.empty() && p.written[0] == 0 && !args[0].kwarg_only();
  p.float_values_free = p.generators.empty() && (p.source.empty() || updates_self) &&
                        std::all_of(p.source.begin(), p.source.end(), [](int src) { return src == 0; });
  p.verify_meta = tensor_results > 1;
}

std::unique_ptr<OpPolicy> make_policy(const c10::OperatorHandle& op) {
  auto p = std::make_unique<OpPolicy>();
  const auto& schema = op.schema();
  read_schema(schema, *p);
  const Rule rule = rule_for(schema);
  p->data_dependent = rule.traits & kDataDependent;
  p->host_indices = rule.traits & kHostIndices;
  if (rule.traits & kIndexOnDevice) {
    auto index = schema.argumentIndexWithName("index");
    TORCH_INTERNAL_ASSERT(index, "neuron: the index-on-device rule does not fit ", schema);
    p->device_only_arg = *index;
  }
  p->fusion = rule.traits & kRowwise ? Fusion::Rowwise : rule.traits & kElementwise ? Fusion::Elementwise : Fusion::None;
  if (p->fusion == Fusion::Rowwise) {
    auto dims = schema.argumentIndexWithName("dim");
    if (!dims) dims = schema.argumentIndexWithName("normalized_shape");
    TORCH_INTERNAL_ASSERT(dims, "neuron: row-wise rule for ", schema, " names no dimension argument");
    p->rowwise_dims_arg = *dims;
  }
  p->exact = rule.exact;
  if (rule.traits & kRunningStats) {
    for (const char* name : {"running_mean", "running_var"})
      if (auto i = schema.argumentIndexWithName(name)) p->running_stats.push_back(*i);
    auto training = schema.argumentIndexWithName("training");
    TORCH_INTERNAL_ASSERT(training || p->running_stats.empty(), "neuron: the running-statistics rule does not fit ",
                          schema);
    if (training) p->training_arg = *training;
  }
  // The device's own tanh replaces ATen's only where it is selected (kernels/tanh.h).
  p->device_op = rule.device_op == DeviceOp::Tanh && !kernels::device_tanh_selected() ? DeviceOp::None : rule.device_op;
  p->place_results = rule.traits & kPlaceResults;
  if (rule.traits & kIndexPutChecks) p->meta_check = check_index_put;
  if (rule.traits & kMultinomialChecks) p->meta_check = check_multinomial;
  p->unsupported_result = rule.traits & kQuantizedResult ? "quantized" : rule.traits & kSparseResult ? "sparse" : nullptr;
  if (p->place_results) p->learned.placement = std::make_unique<PlacementHistory>();
  // (Not hasComputedKernelForDispatchKey: PyTorch registers a Meta fallback
  // for every operator, which raises NotImplementedError where no kernel is.)
  p->has_meta_kernel = op.hasKernelForDispatchKey(c10::DispatchKey::Meta) ||
                       op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
                       op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional);
  p->aten_meta = aten_meta_kernel(op);
  if (!(rule.traits & kNoOutVariant)) p->out_op = out_variant_of(op);
  if (!p->out_op) p->equivalent_out = equivalent_out_call(op);
  p->task_name = schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
  p->counter = &op_counter(schema.operator_name());
  return p;
}

const OpPolicy& lookup(const c10::OperatorHandle& op) {
  static std::mutex mu;
  static ska::flat_hash_map<const c10::FunctionSchema*, std::unique_ptr<OpPolicy>> policies;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = policies[&op.schema()];
  if (!slot) slot = make_policy(op);
  return *slot;
}

} // namespace

bool OpPolicy::writes(size_t i) const { return std::find(written.begin(), written.end(), i) != written.end(); }
bool OpPolicy::is_generator(size_t i) const {
  return std::find(generators.begin(), generators.end(), i) != generators.end();
}

const OpPolicy& op_policy(const c10::OperatorHandle& op) {
  struct Recent {
    const c10::FunctionSchema* schema = nullptr;
    const OpPolicy* policy = nullptr;
  };
  static thread_local std::array<Recent, 256> recent;
  const c10::FunctionSchema* schema = &op.schema();
  // Fibonacci hashing: schemas sit at a fixed offset in large, similarly
  // aligned objects, so their low bits say little.
  Recent& r = recent[(reinterpret_cast<uintptr_t>(schema) * 0x9E3779B97F4A7C15ull) >> 56];
  if (r.schema != schema) r = {schema, &lookup(op)};
  return *r.policy;
}

const std::vector<const char*>& ops_with_cpu_algorithm_choice() {
  static const std::vector<const char*> ops = [] {
    std::vector<const char*> v;
    for (const Rule& r : kRules)
      if (r.traits & kCpuAlgorithm) v.push_back(r.op);
    return v;
  }();
  return ops;
}

} // namespace torchneuron
