#include "elementwise_fusion.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
#include <cstdlib>
#include <unordered_set>

#include "../op_tracking.h"
#include "../ops/aliases.h"

namespace torchneuron {
namespace {

constexpr int64_t kMinNumel = 1 << 15;  // smaller work gains nothing from fusing
constexpr int64_t kPiece = 1 << 15;     // elements per piece: a multiple of every vector step
constexpr size_t kMaxMembers = 16;      // a bound on the fusion window

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> flag{[] {
    const char* v = std::getenv("TORCHNEURON_ADAPTIVE_EAGER");
    return !(v && std::string(v) == "0");
  }()};
  return flag;
}

const std::unordered_set<std::string>& elementwise_names() {
  static const std::unordered_set<std::string> names = {
      "add", "sub", "mul", "div", "neg", "abs", "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt",
      "reciprocal", "pow", "clamp", "clamp_min", "clamp_max", "minimum", "maximum", "where", "eq", "ne", "lt",
      "le", "gt", "ge", "gelu", "silu", "lerp", "addcmul", "addcdiv", "fill", "sign", "floor", "ceil", "trunc",
      "sin", "cos", "erf", "log1p", "expm1", "hardtanh", "leaky_relu", "elu", "softplus", "threshold",
      "threshold_backward", "sigmoid_backward", "tanh_backward", "gelu_backward", "silu_backward",
      "logical_and", "logical_or", "logical_not", "bitwise_and", "bitwise_or", "square", "exp2", "log2"};
  return names;
}

struct Range {
  uintptr_t begin, end;
  size_t itemsize;
};

// A tensor operand of a member: its alias, and whether it is cut into pieces
// (every full-size operand) or passed whole (CPU scalars).
struct Member {
  ElementwiseCall call;
  std::vector<size_t> sliced_args;  // indices into call.args holding full-size tensors
};

struct FusedGroup {
  int64_t numel = 0;
  std::vector<Member> members;
  std::vector<Range> ranges;

  void run();
  void run_range(int64_t begin, int64_t end);
};

// A tensor whose metadata a piece loop may rewrite: a private TensorImpl over
// the same storage (the member's own alias may be shared with other threads).
at::Tensor slice_alias(const at::Tensor& t) {
  auto out = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(t.storage()), t.key_set(), t.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return out;
}

void set_piece(const at::Tensor& slice, int64_t base_offset, int64_t lo, int64_t len) {
  const int64_t size[1] = {len}, stride[1] = {1};
  slice.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(size), c10::IntArrayRef(stride),
                                                      base_offset + lo);
}

void FusedGroup::run_range(int64_t begin, int64_t end) {
  // Private aliases per member, re-pointed at each piece.
  struct Prepared {
    std::vector<c10::IValue> args;
    std::vector<std::pair<at::Tensor, int64_t>> slices;  // alias, its base storage offset
    std::vector<std::pair<at::Tensor, int64_t>> result_slices;
  };
  std::vector<Prepared> prepared(members.size());
  for (size_t m = 0; m < members.size(); ++m) {
    auto& p = prepared[m];
    p.args = members[m].call.args;
    for (size_t i : members[m].sliced_args) {
      const at::Tensor& t = p.args[i].toTensor();
      at::Tensor s = slice_alias(t);
      p.slices.emplace_back(s, t.storage_offset());
      p.args[i] = s;
    }
    for (const at::Tensor& r : members[m].call.results)
      p.result_slices.emplace_back(slice_alias(r), r.storage_offset());
  }
  for (int64_t lo = begin; lo < end; lo += kPiece) {
    const int64_t len = std::min(kPiece, end - lo);
    for (size_t m = 0; m < members.size(); ++m) {
      auto& p = prepared[m];
      for (auto& [s, base] : p.slices) set_piece(s, base, lo, len);
      torch::jit::Stack stack(p.args.begin(), p.args.end());
      try {
        members[m].call.op.callBoxed(&stack);
        for (size_t k = 0; k < p.result_slices.size(); ++k) {
          auto& [s, base] = p.result_slices[k];
          set_piece(s, base, lo, len);
          s.copy_(stack[k].toTensor());
        }
      } catch (const std::exception& e) {
        throw std::runtime_error("in fused member " + members[m].call.name + ": " + e.what());
      }
    }
  }
}

void FusedGroup::run() {
  auto guard = below_autograd();
  // The thread ranges TensorIterator would use for one numel-long kernel.
  const int64_t grain = at::internal::GRAIN_SIZE;
  const int64_t threads = at::get_num_threads();
  const int64_t tasks = (numel < grain || threads == 1) ? 1 : std::min(threads, (numel + grain - 1) / grain);
  const int64_t chunk = (numel + tasks - 1) / tasks;
  if (tasks == 1) return run_range(0, numel);
  at::parallel_for(0, tasks, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) run_range(t * chunk, std::min(numel, (t + 1) * chunk));
  });
}

// The full-size operands of a call (all with the same numel, contiguous), or
// false if the call cannot fuse.
bool collect_operands(const ElementwiseCall& call, int64_t& numel, std::vector<size_t>& sliced,
                      std::vector<Range>& ranges) {
  numel = -1;
  auto accept = [&](const at::Tensor& t) {
    if (!t.defined()) return false;
    if (t.is_cpu() && t.dim() == 0) return true;  // a scalar, passed whole
    if (!t.is_contiguous() || t.is_conj() || t.is_neg()) return false;
    if (numel < 0) numel = t.numel();
    if (t.numel() != numel) return false;
    auto p = reinterpret_cast<uintptr_t>(t.data_ptr());
    ranges.push_back({p, p + t.nbytes(), t.itemsize()});
    return true;
  };
  for (size_t i = 0; i < call.args.size(); ++i) {
    const auto& a = call.args[i];
    if (a.isTensor()) {
      if (!accept(a.toTensor())) return false;
      if (!(a.toTensor().is_cpu() && a.toTensor().dim() == 0)) sliced.push_back(i);
    } else if (a.isTensorList() || a.isList() || a.isGenerator()) {
      return false;
    }
  }
  for (const at::Tensor& r : call.results)
    if (!accept(r) || r.dim() == 0) return false;
  return numel >= kMinNumel;
}

// Tensors of a group must coincide exactly or not overlap at all.
bool compatible(const std::vector<Range>& a, const std::vector<Range>& b) {
  for (const Range& x : a)
    for (const Range& y : b) {
      bool same = x.begin == y.begin && x.end == y.end && x.itemsize == y.itemsize;
      bool disjoint = x.end <= y.begin || y.end <= x.begin;
      if (!same && !disjoint) return false;
    }
  return true;
}

const char kFusedTag = 0;  // payload type marker

} // namespace

bool adaptive_eager_enabled() {
  return enabled_flag().load(std::memory_order_relaxed) && !at::globalContext().deterministicAlgorithms();
}

void set_adaptive_eager(bool enabled) { enabled_flag().store(enabled); }

bool is_elementwise(const c10::FunctionSchema& schema) {
  const std::string& name = schema.name();
  if (name.rfind("aten::", 0) != 0) return false;
  std::string base = name.substr(6);
  if (!base.empty() && base.back() == '_') base.pop_back();  // in-place
  return elementwise_names().count(base) > 0;
}

bool enqueue_fusable(runtime::Stream& stream, ElementwiseCall& call) {
  int64_t numel;
  std::vector<size_t> sliced;
  std::vector<Range> ranges;
  if (!collect_operands(call, numel, sliced, ranges)) return false;

  bool merged = stream.amend_pending_tail([&](runtime::Task& tail) {
    if (!tail.payload) return false;
    auto* tagged = static_cast<std::pair<const char*, FusedGroup>*>(tail.payload.get());
    if (tagged->first != &kFusedTag) return false;
    FusedGroup& g = tagged->second;
    if (g.numel != numel || g.members.size() >= kMaxMembers || !compatible(g.ranges, ranges)) return false;
    g.ranges.insert(g.ranges.end(), ranges.begin(), ranges.end());
    tail.name += "+" + call.name;
    g.members.push_back({std::move(call), std::move(sliced)});
    if (g.members.size() == 2) record_fused(g.members.front().call.name, true);
    record_fused(g.members.back().call.name, false);
    return true;
  });
  if (merged) return true;

  auto state = std::make_shared<std::pair<const char*, FusedGroup>>();
  state->first = &kFusedTag;
  FusedGroup& g = state->second;
  g.numel = numel;
  g.ranges = std::move(ranges);
  std::string name = "fused:" + call.name;
  g.members.push_back({std::move(call), std::move(sliced)});
  runtime::Task task;
  task.name = std::move(name);
  task.payload = state;
  FusedGroup* group = &g;
  task.run = [state, group] { group->run(); };
  stream.enqueue(std::move(task));
  return true;
}

} // namespace torchneuron
