#include "elementwise_fusion.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>  // GRAIN_SIZE: the split unfused kernels use
#include <ATen/ops/empty.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/accumulate.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "../op_tracking.h"
#include "../ops/aliases.h"
#include "../ops/own_kernels.h"
#include "../ops/result_placement.h"
#include "exact_arithmetic.h"
#include "vector_math.h"

namespace torchneuron {
namespace {

constexpr int64_t kPiece = 1 << 15;     // elements per piece: a multiple of every vector step
constexpr int64_t kSlice = 1 << 10;     // elements per slice of exact members: their operands stay in L1
constexpr size_t kMaxMembers = 16;      // a bound on the fusion window
// An exact member's result at least this large is written with non-temporal
// stores (stream_copy), unless the group reads it again: it would leave every
// cache level a core can count on before the next operator reads it.
constexpr int64_t kStreamBytes = 32 << 20;
// Exact members that run one by one (no chains on this machine) prefetch
// their memory inputs this many slices ahead into L2, each member of a run a
// share of the lines, so that the requests are spread over the run's compute
// instead of bunched where the first member reads (a same-process A/B on 16M
// floats: runs 10-25 % faster). Chains prefetch for themselves, and runs with
// chains do without it: there it fell to the library members between chains
// (tanh) in one burst, for no measurable gain.
constexpr int64_t kPrefetchSlices = 2;
// An idle device holds a new group back this long after each operator joins
// it (runtime::Task::linger_ns), for the next one: a host issues an operator
// in 5-20 us, and a group costs at least a pass over 1M elements (~300 us).
// A waiting host, or any other work queued behind the group, starts it at once.
constexpr int64_t kLingerNs = 50'000;

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
      "logical_and", "logical_or", "logical_not", "bitwise_and", "bitwise_or", "square", "exp2", "log2",
      "log10", "tan", "asin", "acos", "atan", "erfc"};
  return names;
}

// Row-wise operators: each row (the last dimension, or the normalised ones)
// is reduced or normalised on its own, with the same arithmetic however many
// rows a call covers, so pieces of whole rows reproduce one call over all of
// them. Value: the index of the argument naming the dimension(s).
const std::unordered_map<std::string, size_t>& rowwise_ops() {
  static const std::unordered_map<std::string, size_t> ops = {
      {"aten::_softmax", 1}, {"aten::_log_softmax", 1}, {"aten::sum.dim_IntList", 1}, {"aten::mean.dim", 1},
      {"aten::amax", 1},     {"aten::amin", 1},         {"aten::native_layer_norm", 1}};
  return ops;
}

struct Range {
  uintptr_t begin, end;
  size_t itemsize;
};

// How a tensor operand of a member covers the group's iteration space, seen
// as `rows` x `row` (row = 0: no broadcasting in the group, one flat row).
enum class Cover {
  Full,     // every element: cut into pieces
  Row,      // one row, broadcast over the rows (a bias): all of it in every piece
  Column,   // one element per row, broadcast along it (a row statistic): cut by rows
  Single,   // one element (any rank, so it keeps its weight in type promotion)
  PerRow,   // one element per row, flat: what a row-wise reduction writes without keepdim
};

// A tensor operand of a member: an argument (or, for a functional call
// without out=, a result). Every tensor a member touches is one, 0-dim ones
// included, so that the group's overlap check sees all memory it reads: a
// tensor freed while the group waits may have its block reused by a member's
// output.
struct Operand {
  size_t index;             // into call.args, or call.results when `result`
  bool result;
  bool write_only;          // written before anything in the group reads it
  Cover cover;
  Range range;
  c10::ScalarType dtype;
  int slot = -1;            // >= 0: elided, lives in this per-piece scratch slot
  bool closed = false;      // its tensor was freed: later uses of the range are new tensors
};

struct Member {
  ElementwiseCall call;
  std::vector<Operand> operands;  // reads before writes
  std::optional<ExactArithmetic> exact;  // runs without ATen (exact_arithmetic.h)
};

struct FusedGroup {
  int64_t numel = 0;
  int64_t row = 0;  // row length when a member broadcasts, else 0
  std::vector<Member> members;
  struct Slot {
    c10::ScalarType dtype;
    size_t last_use;  // the last member to touch the intermediate living there
  };
  std::vector<Slot> slots;  // scratch, shared by intermediates whose lives do not overlap

  bool compatible(const std::vector<Operand>& operands) const;
  void elide(uintptr_t begin, uintptr_t end);
  void run();
  // [begin, end) is one thread's range of unfused kernels, unless `whole`.
  void run_range(int64_t begin, int64_t end, int64_t piece, bool whole = false);
};

// Prefetches into L2 share `part` of `parts` of the slice of `kSlice`
// elements (`left` of them before the thread's range ends) at `at`.
void prefetch_l2(const char* at, int64_t left, size_t itemsize, int64_t part, int64_t parts) {
  if (left <= 0) return;  // past the range
  const int64_t bytes = std::min(kSlice, left) * int64_t(itemsize);
  for (int64_t b = (bytes * part / parts) & ~63, e = (bytes * (part + 1) / parts) & ~63; b < e; b += 64)
    _mm_prefetch(at + b, _MM_HINT_T2);
}

// A tensor whose metadata a piece loop may rewrite: a private TensorImpl over
// the same storage (the member's own alias may be shared with other threads).
at::Tensor slice_alias(const at::Tensor& t) {
  auto out = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(t.storage()), t.key_set(), t.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return out;
}

// Re-points `slice` (an operand's private alias, `base` its storage offset)
// at elements [lo, lo + len) of the iteration space: a flat piece, or whole
// rows (`len / row` of them) when the group broadcasts.
void point(const at::Tensor& slice, Cover cover, int64_t base, int64_t row, int64_t lo, int64_t len) {
  auto* impl = slice.unsafeGetTensorImpl();
  const int64_t ones[2] = {1, 1};
  switch (cover) {
    case Cover::Full: {
      if (row == 0) return impl->set_sizes_and_strides(c10::IntArrayRef(&len, 1), c10::IntArrayRef(ones, 1), base + lo);
      const int64_t rows[2] = {len / row, row}, stride[2] = {row, 1};
      return impl->set_sizes_and_strides(rows, stride, base + lo);
    }
    case Cover::Row: {
      const int64_t size[1] = {row};
      return impl->set_sizes_and_strides(size, c10::IntArrayRef(ones, 1), base);
    }
    case Cover::Column: {
      const int64_t size[2] = {len / row, 1};
      return impl->set_sizes_and_strides(size, ones, base + lo / row);
    }
    case Cover::PerRow: {
      const int64_t size[1] = {len / row};
      return impl->set_sizes_and_strides(size, c10::IntArrayRef(ones, 1), base + lo / row);
    }
    case Cover::Single: {
      const c10::IntArrayRef one(ones, row == 0 ? 1 : 2);  // rank 1 or 2: never 0, which weighs less in promotion
      return impl->set_sizes_and_strides(one, one, base);
    }
  }
}

void FusedGroup::run_range(int64_t begin, int64_t end, int64_t piece, bool whole) {
  // Elided intermediates live in scratch pieces that stay in cache.
  std::vector<at::Tensor> scratch;
  for (const Slot& s : slots) scratch.push_back(at::empty({piece}, at::TensorOptions().dtype(s.dtype)));
  // A slot that only the members of one run of exact members touch holds
  // one slice at a time, at its start: it then stays in L1, where a
  // piece-long one (128 KB and more) would spill each member's writes to L2.
  std::vector<bool> in_slice(slots.size(), !whole);
  {
    std::vector<int64_t> run_of(slots.size(), -1);  // first member of the run using the slot
    int64_t run = -1;
    for (size_t m = 0; m < members.size(); ++m) {
      if (!members[m].exact) run = -1;
      else if (run < 0) run = int64_t(m);
      for (const Operand& o : members[m].operands) {
        if (o.slot < 0) continue;
        if (run < 0 || (run_of[o.slot] >= 0 && run_of[o.slot] != run)) in_slice[o.slot] = false;
        run_of[o.slot] = run;
      }
    }
  }
  // Private aliases per member, re-pointed at each piece.
  struct Slice {
    at::Tensor alias;
    Cover cover;
    int64_t base;  // storage offset; scratch starts every piece at 0
    bool scratch;
    void at(int64_t row, int64_t lo, int64_t len) const { point(alias, cover, base, row, scratch ? 0 : lo, len); }
  };
  struct Prepared {
    std::vector<c10::IValue> args;
    std::vector<Slice> slices, result_slices;
  };
  // An exact member's operand: where element `lo` of the iteration space is
  // (a scratch slot holds the current piece), or one repeated element.
  struct Lane {
    const char* base = nullptr;
    int64_t step = 1;
    bool scratch = false;
    bool in_slice = false;  // a scratch slot holding the current slice only, from its start
    at::Tensor held;  // a single element converted to the member's dtype
    const char* at(int64_t piece_lo, int64_t lo, size_t itemsize) const {
      if (!base) return base;
      const int64_t index = !scratch ? lo : in_slice ? (lo - piece_lo) % kSlice : lo - piece_lo;
      return base + step * index * int64_t(itemsize);
    }
  };
  struct Lanes {
    Lane self, other, out;
    bool stream = false;  // `out` is written with stream_copy
  };
  std::vector<Prepared> prepared(members.size());
  std::vector<Lanes> lanes(members.size());
  for (size_t m = 0; m < members.size(); ++m) {
    const auto& call = members[m].call;
    // Exact members decline to ATen per slice, which must then end where a
    // thread's range does: not when running over everything.
    if (!whole && members[m].exact) {
      const ExactArithmetic& exact = *members[m].exact;
      auto lane = [&](int index) {
        Lane l;
        if (index == -2) return l;  // absent
        for (const Operand& o : members[m].operands) {
          if (o.result != (index == -1) || (index >= 0 && o.index != size_t(index))) continue;
          const at::Tensor& t = o.slot >= 0 ? scratch[o.slot] : o.result ? call.results[0] : call.args[index].toTensor();
          if (o.cover == Cover::Single) {
            l.held = t.to(exact.dtype);
            l.step = 0;
          }
          l.base = static_cast<const char*>((l.held.defined() ? l.held : t).data_ptr());
          l.scratch = o.slot >= 0;
          l.in_slice = o.slot >= 0 && in_slice[o.slot];
        }
        return l;
      };
      lanes[m] = {lane(exact.self), lane(exact.other == -1 ? -2 : exact.other), lane(exact.out)};
      const auto out = reinterpret_cast<uintptr_t>(lanes[m].out.base);
      lanes[m].stream = !lanes[m].out.scratch && numel * int64_t(c10::elementSize(exact.dtype)) >= kStreamBytes;
      for (size_t k = m + 1; k < members.size() && lanes[m].stream; ++k)
        for (const Operand& o : members[k].operands)
          if (o.slot < 0 && o.range.begin <= out && out < o.range.end) lanes[m].stream = false;
      continue;
    }
    auto& p = prepared[m];
    p.args = call.args;
    p.result_slices.resize(call.results.size());
    for (const Operand& o : members[m].operands) {
      const at::Tensor& t = o.slot >= 0 ? scratch[o.slot] : o.result ? call.results[o.index] : call.args[o.index].toTensor();
      if (t.dim() == 0) continue;  // a 0-dim tensor stays one: it weighs less in type promotion
      Slice slice{slice_alias(t), o.cover, o.slot >= 0 ? 0 : t.storage_offset(), o.slot >= 0};
      if (o.result) {
        p.result_slices[o.index] = std::move(slice);
      } else {
        p.args[o.index] = slice.alias;
        p.slices.push_back(std::move(slice));
      }
    }
  }
  // Members [first, end) of a run of exact members as a chain
  // (exact_arithmetic.h), or empty if they are not one: a library function
  // other than sigmoid and the device's tanh, two dtypes, a slot or memory
  // that an earlier member of the chain writes read other than as the value
  // just produced. Slots (in_slice: only this run touches them) are read and
  // written in place where members outside the chain need them.
  auto chain_of = [&](size_t first, size_t end, size_t end_run) {
    std::vector<ChainStep> chain;
    auto same = [](const Lane& a, const Lane& b) { return a.base == b.base && a.scratch == b.scratch; };
    auto written_before = [&](size_t k, const Lane& lane) {
      for (size_t j = first; j < k; ++j)
        if (same(lanes[j].out, lane)) return true;
      return false;
    };
    // By a member after k, other than as the value just produced, before a
    // member overwrites it (a slot serves intermediates in turn).
    auto read_after = [&](size_t k) {
      for (size_t j = k + 1; j < end_run; ++j) {
        for (const Lane* lane : {&lanes[j].self, &lanes[j].other})
          if (same(*lane, lanes[k].out) && (j > k + 1 || j >= end)) return true;
        if (same(lanes[j].out, lanes[k].out)) return false;
      }
      return false;
    };
    for (size_t k = first; k < end; ++k) {
      const ExactArithmetic& op = *members[k].exact;
      const Lanes& l = lanes[k];
      if ((op.kind == ExactArithmetic::Kind::Function && !vector_math::is_sigmoid(*op.function) &&
           !vector_math::is_own_tanh(*op.function, op.dtype)) ||
          op.dtype != members[first].exact->dtype || (l.out.scratch && !l.out.in_slice))
        return std::vector<ChainStep>{};
      ChainStep step{&op};
      for (auto [lane, operand] : {std::pair{&l.self, &step.self}, std::pair{&l.other, &step.other}}) {
        if (!lane->base) continue;  // absent, or a Scalar
        if (k > first && same(*lane, lanes[k - 1].out))
          operand->kind = ChainOperand::Previous;
        else if (lane->step == 0)
          *operand = {ChainOperand::Single, lane->base};
        else if (written_before(k, *lane) || (lane->scratch && !lane->in_slice))
          return std::vector<ChainStep>{};
        else
          *operand = {lane->scratch ? ChainOperand::Slice : ChainOperand::Memory, lane->base};
      }
      if (!l.out.scratch) {
        step.out = const_cast<char*>(l.out.base);
        step.stream = l.stream;
      } else if (read_after(k)) {
        step.out = const_cast<char*>(l.out.base);
        step.out_in_slice = true;
      }
      chain.push_back(step);
    }
    return chain;
  };
  // Runs of exact members, by their first member: the inputs they read from
  // memory (prefetched) and their segments, chains and members that cannot
  // chain (a library function other than sigmoid and the device's tanh) on
  // their own.
  struct Segment {
    size_t first, end;
    ChainProgram chain;  // empty: member by member
  };
  struct Run {
    size_t end = 0;
    // Without chains: the memory inputs whose prefetch the members share,
    // and their item sizes.
    std::vector<std::pair<const Lane*, size_t>> inputs;
    std::vector<Segment> segments;
  };
  std::vector<Run> runs(members.size());
  for (size_t first = 0; first < members.size() && !whole; ++first) {
    if (!members[first].exact || (first > 0 && members[first - 1].exact)) continue;
    Run& run = runs[first];
    run.end = first;
    while (run.end < members.size() && members[run.end].exact) ++run.end;
    const bool chains = chain_chunk(members[first].exact->dtype) > 0;  // none on this machine: one segment
    for (size_t k = first; !chains && k < run.end; ++k)
      for (const Lane* l : {&lanes[k].self, &lanes[k].other})
        if (l->base && !l->scratch && l->step == 1 &&
            std::none_of(run.inputs.begin(), run.inputs.end(), [&](auto& i) { return i.first->base == l->base; }))
          run.inputs.emplace_back(l, c10::elementSize(members[k].exact->dtype));
    if (!chains) run.segments.push_back({first, run.end, {}});
    for (size_t k = first; chains && k < run.end;) {
      size_t stop = k + 1;
      std::vector<ChainStep> chain = chain_of(k, stop, run.end);
      for (; stop < run.end; ++stop) {  // grow the chain while it stays one
        std::vector<ChainStep> longer = chain_of(k, stop + 1, run.end);
        if (longer.empty()) break;
        chain = std::move(longer);
      }
      Segment g{k, stop, chain.empty() ? ChainProgram{} : compile_chain(chain)};
      k = stop;
      run.segments.push_back(std::move(g));
    }
  }
  struct StreamFence {  // streamed stores land before the task can complete, even on an error
    ~StreamFence() { end_streaming(); }
  } fence;
  for (int64_t lo = begin; lo < end; lo += piece) {
    const int64_t len = std::min(piece, end - lo);
    for (size_t m = 0; m < members.size();) {
      try {
        if (!whole && members[m].exact) {
          // A run of exact members goes slice by slice, so that what one
          // writes the next reads from L1.
          const Run& run = runs[m];
          const size_t first = m, end_run = run.end;
          alignas(64) double staging[kSlice];  // a streamed result's slice
          // Members [from, to) over one slice, or part of one, one by one in L1.
          auto run_members = [&](size_t from, size_t to, int64_t s, int64_t n) {
            for (m = from; m < to; ++m) {  // m names the member in errors
              const Lanes& l = lanes[m];
              const size_t size = c10::elementSize(members[m].exact->dtype);
              // This member's share of the prefetch of a later slice.
              const int64_t ahead = s + kPrefetchSlices * kSlice;
              for (auto [input, itemsize] : run.inputs)
                prefetch_l2(input->at(lo, ahead, itemsize), end - ahead, itemsize, m - first, end_run - first);
              char* out = const_cast<char*>(l.out.at(lo, s, size));
              const SliceOperand self{l.self.at(lo, s, size), l.self.step}, other{l.other.at(lo, s, size), l.other.step};
              // Slices start where ATen's vector loop would, so a declined
              // one takes ATen's own paths element by element.
              char* into = l.stream ? reinterpret_cast<char*>(staging) : out;
              if (!run_exact(*members[m].exact, into, self, other, n))
                run_with_aten(*members[m].exact, out, self, other, n);
              else if (l.stream)
                stream_copy(out, into, n * size);
            }
          };
          for (int64_t s = lo; s < lo + len; s += kSlice) {
            const int64_t n = std::min(kSlice, lo + len - s);
            for (const Segment& g : run.segments) {
              if (g.chain.empty()) {
                run_members(g.first, g.end, s, n);
                continue;
              }
              // A chain computes whole chunks in registers, up to a chunk in
              // which run_exact would decline; members compute the rest.
              const int64_t chunk = chain_chunk(g.chain.dtype);
              for (int64_t i = 0; i < n;) {
                i += run_chain(g.chain, s, s + i, n - i);
                const int64_t rest = std::min(chunk, n - i);
                if (rest > 0) run_members(g.first, g.end, s + i, rest);
                i += rest;
              }
            }
          }
          m = end_run;
          continue;
        }
        auto& p = prepared[m];
        for (const Slice& s : p.slices) s.at(row, lo, len);
        torch::jit::Stack stack(p.args.begin(), p.args.end());
        if (p.result_slices.empty()) {
          ops::call_kernel(members[m++].call.op, &stack);
          continue;
        }
        // A functional member computes straight into its piece of the result
        // (or of its scratch), as unfused ones do (result_placement.h).
        std::vector<c10::IValue> into;
        for (Slice& s : p.result_slices) {
          s.at(row, lo, len);
          into.emplace_back(s.alias);
        }
        PlaceResults placing(into, /*enabled=*/true);
        ops::call_kernel(members[m].call.op, &stack);
        placing.settle(std::move(stack));
        ++m;
      } catch (const std::exception& e) {
        throw std::runtime_error("in fused member " + members[m].call.name + ": " + e.what());
      }
    }
  }
}

void FusedGroup::run() {
  auto guard = below_autograd();
  // Nothing joined: one call over everything, as unfused, saves the pieces.
  if (members.size() == 1 && slots.empty()) return run_range(0, numel, numel, /*whole=*/true);
  // The thread ranges TensorIterator would use for one numel-long kernel.
  const int64_t grain = at::internal::GRAIN_SIZE;
  const int64_t threads = at::get_num_threads();
  const int64_t tasks = (numel < grain || threads == 1) ? 1 : std::min(threads, (numel + grain - 1) / grain);
  const int64_t chunk = (numel + tasks - 1) / tasks;
  // Pieces of whole rows match unfused execution only if every thread starts
  // on a row; otherwise each member runs over everything in turn, as unfused.
  if (row > 0 && tasks > 1 && chunk % row != 0) return run_range(0, numel, numel, /*whole=*/true);
  const int64_t piece = row == 0 ? kPiece : std::max<int64_t>(1, kPiece / row) * row;
  if (tasks == 1) return run_range(0, numel, piece);
  at::parallel_for(0, tasks, 1, [&](int64_t b, int64_t e) {
    vector_math::MklOnThisThread sequential;  // library members, called inside this parallel region
    for (int64_t t = b; t < e; ++t) run_range(t * chunk, std::min(numel, (t + 1) * chunk), piece);
  });
}

// The tensor's freed, and nothing outside the group can read it any more (the
// group is still the queue's tail): if the group's first use of it writes it,
// no use needs memory, and the whole lifetime moves to a scratch slot.
void FusedGroup::elide(uintptr_t begin, uintptr_t end) {
  std::vector<std::pair<Operand*, size_t>> uses;  // and the member using it
  for (size_t m = 0; m < members.size(); ++m)
    for (Operand& o : members[m].operands)
      if (!o.closed && o.range.begin >= begin && o.range.end <= end) uses.emplace_back(&o, m);
  if (uses.empty()) return;
  int slot = -1;
  if (uses.front().first->write_only) {
    // A slot whose last user comes before this intermediate's first writer.
    const c10::ScalarType dtype = uses.front().first->dtype;
    for (size_t s = 0; s < slots.size() && slot < 0; ++s)
      if (slots[s].dtype == dtype && slots[s].last_use < uses.front().second) slot = int(s);
    if (slot < 0) {
      slot = int(slots.size());
      slots.push_back({dtype, 0});
    }
    slots[slot].last_use = uses.back().second;
    record_elided();
  }
  for (auto& [o, m] : uses) {
    o->closed = true;
    o->slot = slot;
  }
}

// How `t` covers an iteration space of shape `full`, and the row length
// that cover implies (0: none), or nullopt if it cannot take part.
std::optional<std::pair<Cover, int64_t>> cover_of(const at::Tensor& t, c10::IntArrayRef full, int64_t numel) {
  if (t.numel() == 1) return std::make_pair(Cover::Single, int64_t(0));
  if (!t.is_contiguous() || t.dim() > int64_t(full.size())) return std::nullopt;
  if (t.numel() == numel) return std::make_pair(Cover::Full, int64_t(0));
  // Right-aligned against `full`: leading ones then full's trailing sizes
  // (a row), or full's leading sizes then trailing ones (a column).
  const int64_t lead = int64_t(full.size()) - t.dim();
  auto size = [&](int64_t d) { return d < lead ? 1 : t.size(d - lead); };
  int64_t k = 0;
  while (k < int64_t(full.size()) && size(k) == 1) ++k;
  bool row = k > 0;
  for (int64_t d = k; d < int64_t(full.size()); ++d) row &= size(d) == full[d];
  if (row) return std::make_pair(Cover::Row, c10::multiply_integers(full.begin() + k, full.end()));
  k = int64_t(full.size());
  while (k > 0 && size(k - 1) == 1) --k;
  bool column = k < int64_t(full.size());
  for (int64_t d = 0; d < k; ++d) column &= size(d) == full[d];
  if (column) return std::make_pair(Cover::Column, c10::multiply_integers(full.begin() + k, full.end()));
  return std::nullopt;
}

// The tensor operands of a call and the row length its broadcasting needs
// (0: none), or false if the call cannot fuse. Outputs are contiguous and all
// of one shape; inputs match it or broadcast as a row, a column or a single
// element. Rows must be a multiple of every vector step, so that pieces of
// whole rows start each member's vector loop where unfused execution does.
// A row-wise call's row length, with its dimension argument rewritten for
// pieces of [rows, row] in `dims`; 0 if the call is not row-wise, -1 if it
// is but cannot fuse.
int64_t rowwise_row(const ElementwiseCall& call, c10::IValue& dims) {
  auto it = rowwise_ops().find(call.name);
  if (it == rowwise_ops().end()) return 0;
  const at::Tensor& self = call.args[0].toTensor();
  const c10::IValue& arg = call.args[it->second];
  const int64_t nd = self.dim();
  if (nd == 0) return -1;
  if (call.name == "aten::native_layer_norm") {
    if (!arg.isIntList()) return -1;
    auto shape = arg.toIntVector();
    if (shape.empty() || int64_t(shape.size()) > nd ||
        !std::equal(shape.begin(), shape.end(), self.sizes().end() - shape.size()))
      return -1;
    const int64_t row = c10::multiply_integers(shape);
    dims = c10::IValue(std::vector<int64_t>{row});
    return row;
  }
  int64_t d;
  if (arg.isInt()) {
    d = arg.toInt();
    dims = c10::IValue(int64_t(-1));
  } else if (arg.isIntList() && arg.toIntList().size() == 1) {
    d = arg.toIntList().get(0);
    dims = c10::IValue(std::vector<int64_t>{-1});
  } else {
    return -1;
  }
  return d == -1 || d == nd - 1 ? self.size(-1) : -1;
}

bool collect_operands(ElementwiseCall& call, int64_t& numel, int64_t& row, std::vector<Operand>& operands) {
  const auto& schema = call.op.schema();
  // An in-place call reads what it writes, but for copy_ and fill_.
  const bool reads_self = !schema.name().empty() && schema.name().back() == '_' && schema.name() != "aten::copy_" &&
                          schema.name() != "aten::fill_";
  struct Use {
    const at::Tensor* t;
    size_t index;
    bool result, written;
  };
  std::vector<Use> uses;
  for (size_t i = 0; i < call.args.size(); ++i) {
    const auto& a = call.args[i];
    if (a.isTensor()) {
      const auto* alias = i < schema.arguments().size() ? schema.arguments()[i].alias_info() : nullptr;
      uses.push_back({&a.toTensor(), i, false, alias && alias->isWrite()});
    } else if (a.isTensorList() || a.isGenerator() ||
               (a.isList() && !a.isIntList() && !a.isDoubleList() && !a.isBoolList())) {
      return false;
    }
  }
  for (size_t i = 0; i < call.results.size(); ++i) uses.push_back({&call.results[i], i, true, true});
  c10::IValue dims;
  const int64_t rowwise = rowwise_row(call, dims);
  if (rowwise < 0) return false;
  // The iteration space: a row-wise call's input, else its output.
  const at::Tensor* out = rowwise ? &call.args[0].toTensor() : nullptr;
  for (const Use& u : uses)
    if (u.written && !rowwise) out = u.t;
  if (!out || !out->defined() || out->dim() == 0) return false;
  const c10::IntArrayRef full = out->sizes();
  numel = out->numel();
  row = rowwise;
  if (row != 0 && row % 128 != 0) return false;
  std::vector<Operand> writes;
  for (const Use& u : uses) {
    const at::Tensor& t = *u.t;
    if (!t.defined() || t.is_conj() || t.is_neg()) return false;
    std::optional<std::pair<Cover, int64_t>> cover;
    if (rowwise && u.written && t.is_contiguous() && t.numel() * rowwise == numel)  // a reduction's result
      cover = std::make_pair(t.dim() == out->dim() ? Cover::Column : Cover::PerRow, rowwise);
    else
      cover = cover_of(t, full, numel);
    if (!cover || (u.written && (cover->first == Cover::Single || (cover->first != Cover::Full && !rowwise))))
      return false;
    if (cover->second != 0) {
      if ((row != 0 && row != cover->second) || cover->second % 128 != 0) return false;
      row = cover->second;
    }
    auto p = reinterpret_cast<uintptr_t>(t.data_ptr());
    Operand o{u.index, u.result, u.written && !reads_self, cover->first, {p, p + t.nbytes(), t.itemsize()},
              t.scalar_type()};
    (u.written ? writes : operands).push_back(o);
  }
  operands.insert(operands.end(), writes.begin(), writes.end());
  if (numel < min_fusable_numel()) return false;
  if (rowwise) call.args[rowwise_ops().at(call.name)] = std::move(dims);  // pieces are [rows, row]
  return true;
}

// Tensors of a group must coincide exactly or not overlap at all.
// Coinciding tensors must also be cut alike, so that a piece only ever reads
// elements an earlier member wrote for that same piece (a bias read whole by
// every piece must not share memory with a per-row result).
bool coincide_or_disjoint(const Operand& a, const Operand& b) {
  if (a.slot >= 0 || b.slot >= 0) return true;  // elided: never touches memory
  auto cut = [](Cover c) { return c == Cover::PerRow ? Cover::Column : c; };
  const Range &x = a.range, &y = b.range;
  return (x.begin == y.begin && x.end == y.end && x.itemsize == y.itemsize && cut(a.cover) == cut(b.cover)) ||
         x.end <= y.begin || y.end <= x.begin;
}

bool FusedGroup::compatible(const std::vector<Operand>& operands) const {
  for (const Member& m : members)
    for (const Operand& a : m.operands)
      for (const Operand& b : operands)
        if (!coincide_or_disjoint(a, b)) return false;
  return true;
}

const char kFusedTag = 0;  // payload type marker
using TaggedGroup = std::pair<const char*, FusedGroup>;

// Fused groups queued and not started yet, on any stream. A free looks for a
// group at its stream's tail, under the stream's lock, only when there may be
// one: most frees happen with none waiting.
std::atomic<int64_t> waiting_groups{0};

FusedGroup* group_of(runtime::Task& task) {
  if (!task.payload) return nullptr;
  auto* tagged = static_cast<TaggedGroup*>(task.payload.get());
  return tagged->first == &kFusedTag ? &tagged->second : nullptr;
}

} // namespace

namespace {
std::atomic<int64_t> min_numel{1 << 20};
} // namespace

int64_t min_fusable_numel() { return min_numel.load(std::memory_order_relaxed); }
void set_min_fusable_numel(int64_t numel) { min_numel.store(std::max<int64_t>(numel, 1 << 15)); }

bool adaptive_eager_enabled() {
  return enabled_flag().load(std::memory_order_relaxed) && !at::globalContext().deterministicAlgorithms();
}

void set_adaptive_eager(bool enabled) { enabled_flag().store(enabled); }

bool is_fusable(const c10::FunctionSchema& schema) {
  const std::string& name = schema.name();
  if (name.rfind("aten::", 0) != 0) return false;
  if (rowwise_ops().count(schema.overload_name().empty() ? name : name + "." + schema.overload_name())) return true;
  std::string base = name.substr(6);
  if (!base.empty() && base.back() == '_') base.pop_back();  // in-place
  return elementwise_names().count(base) > 0;
}

bool enqueue_fusable(runtime::Stream& stream, ElementwiseCall& call) {
  int64_t numel, row;
  std::vector<Operand> operands;
  if (!collect_operands(call, numel, row, operands)) return false;
  for (size_t i = 0; i < operands.size(); ++i)  // x[1:].add_(x[:-1]) is ATen's to reject or order
    for (size_t j = 0; j < i; ++j)
      if (!coincide_or_disjoint(operands[i], operands[j])) return false;
  std::optional<ExactArithmetic> exact = exact_arithmetic_of(call);
  for (const Operand& o : operands)
    if (o.cover != Cover::Full && o.cover != Cover::Single) exact.reset();

  bool merged = stream.amend_pending_tail([&](runtime::Task& tail) {
    FusedGroup* g = group_of(tail);
    if (!g || g->numel != numel || g->members.size() >= kMaxMembers || !g->compatible(operands)) return false;
    if (row != 0 && g->row != 0 && row != g->row) return false;
    if (row != 0) g->row = row;
    tail.name += "+" + call.name;
    g->members.push_back({std::move(call), std::move(operands), std::move(exact)});
    if (g->members.size() == 2) record_fused(g->members.front().call.name, true);
    record_fused(g->members.back().call.name, false);
    return true;
  });
  if (merged) return true;

  auto state = std::make_shared<TaggedGroup>();
  state->first = &kFusedTag;
  FusedGroup& g = state->second;
  g.numel = numel;
  g.row = row;
  std::string name = "fused:" + call.name;
  g.members.push_back({std::move(call), std::move(operands), std::move(exact)});
  runtime::Task task;
  task.name = std::move(name);
  task.payload = state;
  task.linger_ns = kLingerNs;
  FusedGroup* group = &g;
  task.run = [state, group] {
    waiting_groups.fetch_sub(1, std::memory_order_relaxed);  // no longer in a queue: nobody amends it
    group->run();
  };
  waiting_groups.fetch_add(1);
  stream.enqueue(std::move(task));
  return true;
}

void release_from_pending_group(runtime::Stream& stream, const void* ptr, size_t nbytes) {
  if (waiting_groups.load() == 0 || !adaptive_eager_enabled()) return;
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  stream.amend_pending_tail([&](runtime::Task& tail) {
    if (FusedGroup* g = group_of(tail)) g->elide(begin, begin + nbytes);
    return true;
  });
}

} // namespace torchneuron
