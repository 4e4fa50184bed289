#include "out_variants.h"

#include <mutex>
#include <unordered_map>

namespace torchneuron {
namespace {

bool writes(const c10::Argument& a) { return a.alias_info() && a.alias_info()->isWrite(); }

bool matches(const c10::FunctionSchema& f, const c10::FunctionSchema& o) {
  const auto &fa = f.arguments(), &oa = o.arguments();
  const size_t n = fa.size(), k = f.returns().size();
  if (k == 0 || oa.size() != n + k || o.returns().size() != k) return false;
  for (size_t i = 0; i < n; ++i)
    if (oa[i].name() != fa[i].name() || *oa[i].type() != *fa[i].type() || writes(oa[i])) return false;
  for (size_t i = n; i < n + k; ++i)
    if (!oa[i].kwarg_only() || !writes(oa[i]) || oa[i].type()->kind() != c10::TypeKind::TensorType) return false;
  for (const auto& r : f.returns())
    if (r.type()->kind() != c10::TypeKind::TensorType || r.alias_info()) return false;
  return true;
}

// Every overload name of each operator, for the few whose out= overload has
// an irregular name (sum.dim_IntList -> sum.IntList_out, max.dim -> max.dim_max).
const std::vector<std::string>& overloads_of(const std::string& name) {
  static const auto all = [] {
    std::unordered_map<std::string, std::vector<std::string>> m;
    for (const auto& op : c10::Dispatcher::singleton().getAllOpNames()) m[op.name].push_back(op.overload_name);
    return m;
  }();
  static const std::vector<std::string> none;
  auto it = all.find(name);
  return it == all.end() ? none : it->second;
}

} // namespace

std::optional<c10::OperatorHandle> out_variant_of(const c10::OperatorHandle& functional) {
  static std::mutex mu;
  static std::unordered_map<const c10::FunctionSchema*, std::optional<c10::OperatorHandle>> found;
  const auto& f = functional.schema();
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = found.find(&f); it != found.end()) return it->second;
  std::optional<c10::OperatorHandle> result;
  // Only structured operators: their functional and out= forms are one kernel.
  // An unstructured out= kernel may differ (use its output as scratch, leave
  // parts of it unwritten), so those keep the functional call plus a copy.
  // _log_softmax_backward_data: the Python meta function gives its result the
  // gradient's strides, and the CPU out= kernel then writes a transposed
  // gradient as if it were contiguous (wrong values); the functional kernel
  // plus a copy is right for any strides.
  if (!functional.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
      f.name() == "aten::_log_softmax_backward_data") {
    found.emplace(&f, result);
    return result;
  }
  // Most out= overloads are named by a pattern; any overload that matches the
  // schema will do, so the others are searched after those.
  auto& dispatcher = c10::Dispatcher::singleton();
  const std::string& overload = f.overload_name();
  std::vector<std::string> candidates{"out", overload + "_out", overload + "out"};
  const auto& others = overloads_of(f.name());
  candidates.insert(candidates.end(), others.begin(), others.end());
  for (const std::string& candidate : candidates) {
    auto op = dispatcher.findOp(c10::OperatorName(f.name(), candidate));
    if (op && matches(f, op->schema()) &&
        (op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
         op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd))) {
      result = op;
      break;
    }
  }
  found.emplace(&f, result);
  return result;
}

std::optional<EquivalentOutCall> equivalent_out_call(const c10::OperatorHandle& functional) {
  const auto& f = functional.schema();
  // at::native::relu (CPU): checks for bool, then returns at::clamp_min(self, 0).
  if (f.name() == "aten::relu" && f.overload_name().empty()) {
    auto op = c10::Dispatcher::singleton().findOp(c10::OperatorName("aten::clamp_min", "out"));
    if (!op) return std::nullopt;
    return EquivalentOutCall{*op, {c10::IValue(c10::Scalar(int64_t{0}))}, [](c10::ArrayRef<c10::IValue> args) {
                               return args[0].isTensor() && args[0].toTensor().scalar_type() != c10::kBool;
                             }};
  }
  return std::nullopt;
}

} // namespace torchneuron
