#include "call_verdicts.h"

#include <ATen/ops/empty_strided.h>

#include <algorithm>
#include <numeric>
#include <optional>

#include "host_views.h"
#include "meta.h"
#include "op_policy.h"

namespace torchneuron {
namespace {

c10::SmallVector<int64_t, 6> dense_strides(c10::IntArrayRef sizes, const DimOrder& order) {
  c10::SmallVector<int64_t, 6> strides(sizes.size());
  int64_t step = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    strides[*it] = step;
    step *= std::max<int64_t>(sizes[*it], 1);
  }
  return strides;
}

// The order in which `t` is dense (outermost first), if it is dense in one:
// dimensions by falling stride, a size-1 dimension inside a larger one of
// the same stride.
std::optional<DimOrder> dense_order(const at::Tensor& t) {
  if (t.storage_offset() != 0 || t.dim() > 64) return std::nullopt;
  const auto sizes = t.sizes(), strides = t.strides();
  DimOrder order(t.dim());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int8_t a, int8_t b) {
    if (strides[a] != strides[b]) return strides[a] > strides[b];
    return (sizes[a] == 1) < (sizes[b] == 1);
  });
  if (c10::IntArrayRef(dense_strides(sizes, order)) != strides) return std::nullopt;
  return order;
}

std::vector<at::Tensor> fresh_tensors(const OpPolicy& policy, c10::ArrayRef<c10::IValue> returns) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < returns.size(); ++i)
    if (policy.source[i] < 0) for_each_tensor(returns[i], [&](const at::Tensor& t) { out.push_back(t); });
  return out;
}

// Judges one observed tensor against its prediction; false if the verdict
// must be Synchronous.
bool judge(const at::Tensor& seen, const at::Tensor& predicted, DimOrder& order, bool& reordered) {
  if (seen.defined() != predicted.defined()) return false;
  if (!seen.defined()) return true;
  if (seen.scalar_type() != predicted.scalar_type() || seen.sizes() != predicted.sizes() ||
      seen.is_conj() != predicted.is_conj() || seen.is_neg() != predicted.is_neg())
    return false;
  if (seen.strides() == predicted.strides() && seen.storage_offset() == predicted.storage_offset()) return true;
  auto dense = dense_order(seen);
  if (!dense) return false;
  order = std::move(*dense);
  reordered = true;
  return true;
}

at::Tensor laid_out(const at::Tensor& predicted, const DimOrder& order) {
  if (order.empty() || !predicted.defined()) return predicted;
  return at::empty_strided(predicted.sizes(), dense_strides(predicted.sizes(), order),
                           predicted.options().device(c10::kMeta));
}

} // namespace

CallVerdict judge_first_call(const OpPolicy& policy, const MetaResult& predicted, c10::ArrayRef<c10::IValue> results,
                             const std::vector<at::Tensor>& written) {
  CallVerdict v;
  const auto seen = fresh_tensors(policy, results), expected = fresh_tensors(policy, predicted.returns);
  v.kind = CallVerdict::Kind::Synchronous;
  if (seen.size() != expected.size() || written.size() != predicted.written.size()) return v;
  bool reordered = false;
  v.result_orders.resize(seen.size());
  for (size_t k = 0; k < seen.size(); ++k)
    if (!judge(seen[k], expected[k], v.result_orders[k], reordered)) return v;
  v.written_orders.resize(written.size());
  for (size_t k = 0; k < written.size(); ++k)
    if (predicted.written[k].defined() && !judge(written[k], predicted.written[k], v.written_orders[k], reordered))
      return v;
  v.kind = reordered ? CallVerdict::Kind::QueueInLayouts : CallVerdict::Kind::Queue;
  if (!reordered) v.result_orders.clear(), v.written_orders.clear();
  return v;
}

std::shared_ptr<const MetaResult> in_learned_layouts(const OpPolicy& policy, const MetaResult& predicted,
                                                     const CallVerdict& verdict) {
  auto out = std::make_shared<MetaResult>(predicted);
  out->observed = true;
  size_t k = 0;
  for (size_t i = 0; i < out->returns.size(); ++i) {
    if (policy.source[i] >= 0) continue;
    out->returns[i] = map_tensors(out->returns[i], [&](const at::Tensor& t) {
      return laid_out(t, verdict.result_orders[k++]);
    });
  }
  for (size_t w = 0; w < out->written.size(); ++w) out->written[w] = laid_out(out->written[w], verdict.written_orders[w]);
  return out;
}

} // namespace torchneuron
