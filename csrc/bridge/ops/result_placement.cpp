#include "result_placement.h"

#include <c10/core/CPUAllocator.h>

#include <mutex>
#include <unordered_set>

#include "aliases.h"

namespace torchneuron {
namespace {

struct Target {
  void* ptr;
  size_t nbytes;
  bool taken = false;
};

thread_local std::vector<Target>* tls_targets = nullptr;
c10::DeleterFnPtr base_raw_delete = nullptr;

void no_delete(void*) {}

// Raw allocations keep working through the base allocator; placed memory is
// never freed by anyone but the device allocator.
void raw_delete(void* p) {
  if (tls_targets)
    for (const Target& t : *tls_targets)
      if (t.taken && t.ptr == p) return;
  base_raw_delete(p);
}

// Wraps the CPU allocator in place at first use: the placing is a property of
// the running task (thread-local); every other allocation goes through.
struct PlacingAllocator final : c10::Allocator {
  c10::Allocator* base;
  explicit PlacingAllocator(c10::Allocator* b) : base(b) {}

  c10::DataPtr allocate(size_t n) override {
    if (tls_targets && n > 0)
      for (Target& t : *tls_targets)
        if (!t.taken && t.nbytes == n) {
          t.taken = true;
          return c10::DataPtr(t.ptr, t.ptr, no_delete, c10::Device(c10::kCPU));
        }
    return base->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return base_raw_delete ? raw_delete : nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { base->copy_data(dest, src, count); }
};

void install() {
  static std::once_flag once;
  std::call_once(once, [] {
    static PlacingAllocator placing(c10::GetCPUAllocator());
    base_raw_delete = placing.base->raw_deleter();
    c10::SetCPUAllocator(&placing, /*priority=*/1);
  });
}

bool same_view(const at::Tensor& a, const at::Tensor& b) {
  return a.data_ptr() == b.data_ptr() && a.sizes() == b.sizes() && a.strides() == b.strides() &&
         a.dtype() == b.dtype();
}

void collect(const c10::IValue& v, std::vector<at::Tensor>& out) {
  for_each_tensor(v, [&](const at::Tensor& t) { out.push_back(t); });
}

} // namespace

bool places_results(const std::string& op_name) {
  static const std::unordered_set<std::string> ops = {
      "aten::native_layer_norm", "aten::native_layer_norm_backward", "aten::native_group_norm",
      "aten::native_group_norm_backward", "aten::native_batch_norm", "aten::native_batch_norm_backward",
      "aten::_native_batch_norm_legit", "aten::_native_batch_norm_legit_no_training",
      "aten::embedding_dense_backward", "aten::_embedding_bag", "aten::_embedding_bag_dense_backward",
      "aten::index_select", "aten::_log_softmax_backward_data",
      "aten::_scaled_dot_product_flash_attention_for_cpu",
      "aten::_scaled_dot_product_flash_attention_for_cpu_backward"};
  return ops.count(op_name) > 0;
}

PlaceResults::PlaceResults(const std::vector<c10::IValue>& outputs, bool enabled) {
  if (!enabled) return;
  install();
  static thread_local std::vector<Target> targets;
  targets.clear();
  std::vector<at::Tensor> ts;
  for (const auto& o : outputs) collect(o, ts);
  for (const at::Tensor& t : ts)
    if (t.defined() && t.numel() > 0 && t.is_contiguous())
      targets.push_back({t.data_ptr(), t.nbytes()});
  tls_targets = &targets;
}

PlaceResults::~PlaceResults() { tls_targets = nullptr; }

void settle_results(const std::vector<c10::IValue>& results, const std::vector<c10::IValue>& outputs) {
  std::vector<at::Tensor> from, into;
  for (const auto& r : results) collect(r, from);
  for (const auto& o : outputs) collect(o, into);
  TORCH_INTERNAL_ASSERT(from.size() == into.size(), "kernel returned ", from.size(), " tensors, expected ",
                        into.size());
  // A result not in place may sit in memory placed for another result:
  // take it out before any copy can overwrite it.
  auto in_outputs = [&](const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return false;
    auto* p = static_cast<const char*>(t.storage().data());
    for (const at::Tensor& o : into)
      if (o.defined() && o.numel() > 0) {
        auto* b = static_cast<const char*>(o.data_ptr());
        if (p >= b && p < b + o.nbytes()) return true;
      }
    return false;
  };
  std::vector<bool> placed(from.size());
  for (size_t i = 0; i < from.size(); ++i) {
    if (!into[i].defined() || into[i].numel() == 0) continue;
    placed[i] = same_view(from[i], into[i]);
    if (!placed[i] && in_outputs(from[i])) from[i] = from[i].clone();
  }
  for (size_t i = 0; i < from.size(); ++i)
    if (into[i].defined() && into[i].numel() > 0 && !placed[i]) into[i].copy_(from[i]);
}

} // namespace torchneuron
