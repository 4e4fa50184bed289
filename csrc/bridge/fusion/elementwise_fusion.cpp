#include "elementwise_fusion.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/ops/empty.h>
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

// A full-size tensor operand of a member: an argument (or, for a functional
// call without out=, a result), cut into pieces when the group runs.
struct Operand {
  size_t index;             // into call.args, or call.results when `result`
  bool result;
  bool write_only;          // written before anything in the group reads it
  Range range;
  c10::ScalarType dtype;
  int slot = -1;            // >= 0: elided, lives in this per-piece scratch slot
  bool closed = false;      // its tensor was freed: later uses of the range are new tensors
};

struct Member {
  ElementwiseCall call;
  std::vector<Operand> operands;  // reads before writes
};

struct FusedGroup {
  int64_t numel = 0;
  std::vector<Member> members;
  std::vector<c10::ScalarType> slots;  // dtype of each scratch slot

  bool compatible(const std::vector<Operand>& operands) const;
  void elide(uintptr_t begin, uintptr_t end);
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
  // Elided intermediates live in scratch pieces that stay in cache.
  std::vector<at::Tensor> scratch;
  for (c10::ScalarType t : slots) scratch.push_back(at::empty({kPiece}, at::TensorOptions().dtype(t)));
  // Private aliases per member, re-pointed at each piece: (alias, base offset; -1 = scratch).
  struct Prepared {
    std::vector<c10::IValue> args;
    std::vector<std::pair<at::Tensor, int64_t>> slices, result_slices;
  };
  std::vector<Prepared> prepared(members.size());
  for (size_t m = 0; m < members.size(); ++m) {
    auto& p = prepared[m];
    const auto& call = members[m].call;
    p.args = call.args;
    p.result_slices.resize(call.results.size());
    for (const Operand& o : members[m].operands) {
      const at::Tensor& t = o.slot >= 0 ? scratch[o.slot] : o.result ? call.results[o.index] : call.args[o.index].toTensor();
      auto slice = std::make_pair(slice_alias(t), o.slot >= 0 ? int64_t(-1) : t.storage_offset());
      if (o.result) {
        p.result_slices[o.index] = std::move(slice);
      } else {
        p.args[o.index] = slice.first;
        p.slices.push_back(std::move(slice));
      }
    }
  }
  auto point = [](std::pair<at::Tensor, int64_t>& s, int64_t lo, int64_t len) {
    s.second < 0 ? set_piece(s.first, 0, 0, len) : set_piece(s.first, s.second, lo, len);
  };
  for (int64_t lo = begin; lo < end; lo += kPiece) {
    const int64_t len = std::min(kPiece, end - lo);
    for (size_t m = 0; m < members.size(); ++m) {
      auto& p = prepared[m];
      for (auto& s : p.slices) point(s, lo, len);
      torch::jit::Stack stack(p.args.begin(), p.args.end());
      try {
        members[m].call.op.callBoxed(&stack);
        for (size_t k = 0; k < p.result_slices.size(); ++k) {
          point(p.result_slices[k], lo, len);
          p.result_slices[k].first.copy_(stack[k].toTensor());
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

// The tensor's freed, and nothing outside the group can read it any more (the
// group is still the queue's tail): if the group's first use of it writes it,
// no use needs memory, and the whole lifetime moves to a scratch slot.
void FusedGroup::elide(uintptr_t begin, uintptr_t end) {
  std::vector<Operand*> uses;
  for (Member& m : members)
    for (Operand& o : m.operands)
      if (!o.closed && o.range.begin >= begin && o.range.end <= end) uses.push_back(&o);
  if (uses.empty()) return;
  const bool elidable = uses.front()->write_only;
  if (elidable) {
    slots.push_back(uses.front()->dtype);
    record_elided();
  }
  for (Operand* o : uses) {
    o->closed = true;
    if (elidable) o->slot = int(slots.size()) - 1;
  }
}

// The full-size operands of a call (all with the same numel, contiguous), or
// false if the call cannot fuse.
bool collect_operands(const ElementwiseCall& call, int64_t& numel, std::vector<Operand>& operands) {
  numel = -1;
  const auto& schema = call.op.schema();
  const bool inplace = !schema.name().empty() && schema.name().back() == '_';
  std::vector<Operand> writes;
  auto accept = [&](const at::Tensor& t, size_t index, bool result, bool written) {
    if (!t.defined()) return false;
    if (t.is_cpu() && t.dim() == 0 && !result) return true;  // a scalar, passed whole
    if (!t.is_contiguous() || t.is_conj() || t.is_neg() || t.dim() == 0) return false;
    if (numel < 0) numel = t.numel();
    if (t.numel() != numel) return false;
    auto p = reinterpret_cast<uintptr_t>(t.data_ptr());
    Operand o{index, result, written && !inplace, {p, p + t.nbytes(), t.itemsize()}, t.scalar_type()};
    (written ? writes : operands).push_back(o);
    return true;
  };
  for (size_t i = 0; i < call.args.size(); ++i) {
    const auto& a = call.args[i];
    if (a.isTensor()) {
      const auto* alias = i < schema.arguments().size() ? schema.arguments()[i].alias_info() : nullptr;
      if (!accept(a.toTensor(), i, false, alias && alias->isWrite())) return false;
    } else if (a.isTensorList() || a.isList() || a.isGenerator()) {
      return false;
    }
  }
  for (size_t i = 0; i < call.results.size(); ++i)
    if (!accept(call.results[i], i, true, true)) return false;
  operands.insert(operands.end(), writes.begin(), writes.end());
  return numel >= kMinNumel;
}

// Tensors of a group must coincide exactly or not overlap at all.
bool FusedGroup::compatible(const std::vector<Operand>& operands) const {
  for (const Member& m : members)
    for (const Operand& a : m.operands)
      for (const Operand& b : operands) {
        const Range &x = a.range, &y = b.range;
        bool same = x.begin == y.begin && x.end == y.end && x.itemsize == y.itemsize;
        bool disjoint = x.end <= y.begin || y.end <= x.begin;
        if (!same && !disjoint) return false;
      }
  return true;
}

const char kFusedTag = 0;  // payload type marker
using TaggedGroup = std::pair<const char*, FusedGroup>;

FusedGroup* group_of(runtime::Task& task) {
  if (!task.payload) return nullptr;
  auto* tagged = static_cast<TaggedGroup*>(task.payload.get());
  return tagged->first == &kFusedTag ? &tagged->second : nullptr;
}

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
  std::vector<Operand> operands;
  if (!collect_operands(call, numel, operands)) return false;

  bool merged = stream.amend_pending_tail([&](runtime::Task& tail) {
    FusedGroup* g = group_of(tail);
    if (!g || g->numel != numel || g->members.size() >= kMaxMembers || !g->compatible(operands)) return false;
    tail.name += "+" + call.name;
    g->members.push_back({std::move(call), std::move(operands)});
    if (g->members.size() == 2) record_fused(g->members.front().call.name, true);
    record_fused(g->members.back().call.name, false);
    return true;
  });
  if (merged) return true;

  auto state = std::make_shared<TaggedGroup>();
  state->first = &kFusedTag;
  FusedGroup& g = state->second;
  g.numel = numel;
  std::string name = "fused:" + call.name;
  g.members.push_back({std::move(call), std::move(operands)});
  runtime::Task task;
  task.name = std::move(name);
  task.payload = state;
  FusedGroup* group = &g;
  task.run = [state, group] { group->run(); };
  stream.enqueue(std::move(task));
  return true;
}

void release_from_pending_group(runtime::Stream& stream, const void* ptr, size_t nbytes) {
  if (!adaptive_eager_enabled()) return;
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  stream.amend_pending_tail([&](runtime::Task& tail) {
    if (FusedGroup* g = group_of(tail)) g->elide(begin, begin + nbytes);
    return true;
  });
}

} // namespace torchneuron
