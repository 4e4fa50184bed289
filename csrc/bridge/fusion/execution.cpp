// Running a fused group: each thread's range of the unfused kernels is cut
// into pieces (whole rows where the group broadcasts), and every member runs
// on each piece in turn. Runs of exact members go slice by slice in L1 in
// fusion's own loops, as register chains where they form one
// (../kernels/exact_arithmetic.h); the other members call their ATen kernel
// on views re-pointed at the piece.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>

#include "../exec/host_views.h"
#include "../sanitizers/memcheck.h"
#include "../exec/launch.h"
#include "../exec/op_policy.h"
#include "../exec/result_placement.h"
#include "../exec/thread_count.h"
#include "../kernels/vector_math.h"
#include "cost_model.h"
#include "fused_group.h"

namespace torchneuron::fusion {
namespace {

// An exact member's result at least this large is written with non-temporal
// stores (stream_copy), unless the group reads it again: it would leave every
// cache level a core can count on before the next operator reads it.
constexpr int64_t kStreamBytes = 32 << 20;
// A tensor whose metadata a piece loop may rewrite: a private TensorImpl over
// the same storage (the member's own view may be shared with other threads).
at::Tensor slice_view(const at::Tensor& t) {
  auto out = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(t.storage()), t.key_set(), t.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return out;
}

// Re-points `slice` (an operand's private view, `base` its storage offset)
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

// One thread's range of a group: what it prepares once (scratch for elided
// intermediates, a private view per operand of each ATen member, the lanes
// of each exact member, the runs of exact members and their chains), then
// the pieces.
class RangeRun {
 public:
  RangeRun(FusedGroup& group, int64_t begin, int64_t end, int64_t piece, bool whole)
      : g_(group), members_(group.members), begin_(begin), end_(end), piece_(piece), whole_(whole),
        prepared_(members_.size()), lanes_(members_.size()), runs_(members_.size()) {
    make_scratch();
    for (size_t m = 0; m < members_.size(); ++m) {
      // Exact members decline to ATen per slice, which must then end where a
      // thread's range does: not when running over everything.
      if (!whole_ && members_[m].exact) prepare_lanes(m);
      else prepare_views(m);
    }
    for (size_t first = 0; first < members_.size() && !whole_; ++first)
      if (members_[first].exact && (first == 0 || !members_[first - 1].exact)) plan_run(first);
  }

  void run() {
    struct StreamFence {  // streamed stores land before the task can complete, even on an error
      ~StreamFence() { end_streaming(); }
    } fence;
    for (int64_t lo = begin_; lo < end_; lo += piece_) {
      const int64_t len = std::min(piece_, end_ - lo);
      for (size_t m = 0; m < members_.size();) {
        current_ = m;
        try {
          if (!whole_ && members_[m].exact) {
            run_exact_run(m, lo, len);
            m = runs_[m].end;
          } else {
            run_aten_member(m++, lo, len);
          }
        } catch (c10::Error& e) {  // keeps its type (IndexError, ValueError, ...), which the user sees
          e.add_context("in fused member " + members_[current_].call.policy->task_name);
          throw;
        } catch (const std::exception& e) {
          throw std::runtime_error("in fused member " + members_[current_].call.policy->task_name + ": " + e.what());
        }
      }
    }
  }

 private:
  // A private view per operand, re-pointed at each piece.
  struct Slice {
    at::Tensor view;
    Cover cover;
    int64_t base;  // storage offset; scratch starts every piece at 0
    bool scratch;
    void at(int64_t row, int64_t lo, int64_t len) const { point(view, cover, base, row, scratch ? 0 : lo, len); }
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
  // A run of exact members, by its first member: its segments (chains, and
  // members that cannot chain, such as a library function other than sigmoid
  // and the device's own tanh (MKL's tanh, by default), on their own).
  struct Segment {
    size_t first, end;
    ChainProgram chain;  // empty: member by member
  };
  struct Run {
    size_t end = 0;
    std::vector<Segment> segments;
  };

  // Elided intermediates live in scratch pieces that stay in cache. A slot
  // that only the members of one run of exact members touch holds one slice
  // at a time, at its start: it then stays in L1, where a piece-long one
  // (128 KB and more) would spill each member's writes to L2.
  void make_scratch() {
    for (const FusedGroup::Slot& s : g_.slots) scratch_.push_back(at::empty({piece_}, at::TensorOptions().dtype(s.dtype)));
    in_slice_.assign(g_.slots.size(), !whole_);
    std::vector<int64_t> run_of(g_.slots.size(), -1);  // first member of the run using the slot
    int64_t run = -1;
    for (size_t m = 0; m < members_.size(); ++m) {
      if (!members_[m].exact) run = -1;
      else if (run < 0) run = int64_t(m);
      for (const Operand& o : members_[m].operands) {
        if (o.slot < 0) continue;
        if (run < 0 || (run_of[o.slot] >= 0 && run_of[o.slot] != run)) in_slice_[o.slot] = false;
        run_of[o.slot] = run;
      }
    }
  }

  const at::Tensor& tensor_of(const Member& member, const Operand& o, int index) const {
    if (o.slot >= 0) return scratch_[o.slot];
    return o.result ? member.call.results[index] : member.call.args[index].toTensor();
  }

  // An exact member's operand `index` (an argument, -1: the result, -2: absent).
  Lane lane_of(size_t m, int index) {
    Lane l;
    if (index == -2) return l;
    const ExactArithmetic& exact = *members_[m].exact;
    for (const Operand& o : members_[m].operands) {
      if (o.result != (index == -1) || (index >= 0 && o.index != size_t(index))) continue;
      const at::Tensor& t = tensor_of(members_[m], o, o.result ? 0 : index);
      if (o.cover == Cover::Single) {
        l.held = t.to(exact.dtype);
        l.step = 0;
      }
      l.base = static_cast<const char*>((l.held.defined() ? l.held : t).data_ptr());
      l.scratch = o.slot >= 0;
      l.in_slice = o.slot >= 0 && in_slice_[o.slot];
    }
    return l;
  }

  void prepare_lanes(size_t m) {
    const ExactArithmetic& exact = *members_[m].exact;
    Lanes& l = lanes_[m];
    l = {lane_of(m, exact.self), lane_of(m, exact.other == -1 ? -2 : exact.other), lane_of(m, exact.out)};
    // Streamed unless the group reads the result again.
    const auto out = reinterpret_cast<uintptr_t>(l.out.base);
    l.stream = !l.out.scratch && g_.numel * int64_t(c10::elementSize(exact.dtype)) >= kStreamBytes;
    for (size_t k = m + 1; k < members_.size() && l.stream; ++k)
      for (const Operand& o : members_[k].operands)
        if (o.slot < 0 && o.range.begin <= out && out < o.range.end) l.stream = false;
  }

  void prepare_views(size_t m) {
    const auto& call = members_[m].call;
    Prepared& p = prepared_[m];
    p.args = call.args;
    p.result_slices.resize(call.results.size());
    for (const Operand& o : members_[m].operands) {
      const at::Tensor& t = tensor_of(members_[m], o, int(o.index));
      if (t.dim() == 0) continue;  // a 0-dim tensor stays one: it weighs less in type promotion
      Slice slice{slice_view(t), o.cover, o.slot >= 0 ? 0 : t.storage_offset(), o.slot >= 0};
      if (o.result) {
        p.result_slices[o.index] = std::move(slice);
      } else {
        p.args[o.index] = slice.view;
        p.slices.push_back(std::move(slice));
      }
    }
  }

  static bool same(const Lane& a, const Lane& b) { return a.base == b.base && a.scratch == b.scratch; }

  // The member of [first, k) that last wrote `lane`, or -1: what a member k
  // reading `lane` reads (a slot serves intermediates in turn).
  int last_writer(size_t first, size_t k, const Lane& lane) const {
    for (size_t j = k; j-- > first;)
      if (same(lanes_[j].out, lane)) return int(j);
    return -1;
  }

  // Whether a member outside the chain [.., end), up to the run's end, reads
  // k's result before a member overwrites it: members of the chain read it
  // from registers or a held chunk.
  bool read_after(size_t k, size_t end, size_t end_run) const {
    for (size_t j = k + 1; j < end_run; ++j) {
      for (const Lane* lane : {&lanes_[j].self, &lanes_[j].other})
        if (same(*lane, lanes_[k].out) && j >= end) return true;
      if (same(lanes_[j].out, lanes_[k].out)) return false;
    }
    return false;
  }

  // Member k as a step of the chain starting at `first`, or false if it cannot
  // be one: a library function other than sigmoid and the device's own tanh,
  // two dtypes, a slot that holds more than the current slice. What an
  // earlier member of the chain wrote, it reads as that member's value
  // (Previous or Held), never from memory. Slots (in_slice: only this run
  // touches them) are read and written in place where members outside the
  // chain need them.
  bool chain_step(size_t first, size_t k, size_t end, size_t end_run, ChainStep& step) const {
    const ExactArithmetic& op = *members_[k].exact;
    const Lanes& l = lanes_[k];
    if ((op.kind == ExactArithmetic::Kind::Function && !vector_math::is_sigmoid(*op.function) &&
         !vector_math::is_own_tanh(*op.function, op.dtype)) ||
        op.dtype != members_[first].exact->dtype || (l.out.scratch && !l.out.in_slice))
      return false;
    step = ChainStep{&op};
    for (auto [lane, operand] : {std::pair{&l.self, &step.self}, std::pair{&l.other, &step.other}}) {
      if (!lane->base) continue;  // absent, or a Scalar
      if (k > first && same(*lane, lanes_[k - 1].out))
        operand->kind = ChainOperand::Previous;
      else if (lane->step == 0)
        *operand = {ChainOperand::Single, lane->base};
      else if (const int j = last_writer(first, k, *lane); j >= 0)
        *operand = {ChainOperand::Held, nullptr, j - int(first)};
      else if (lane->scratch && !lane->in_slice)
        return false;
      else
        *operand = {lane->scratch ? ChainOperand::Slice : ChainOperand::Memory, lane->base};
    }
    if (!l.out.scratch) {
      step.out = const_cast<char*>(l.out.base);
      step.stream = l.stream;
    } else if (read_after(k, end, end_run)) {
      step.out = const_cast<char*>(l.out.base);
      step.out_in_slice = true;
    }
    return true;
  }

  // Members [first, end) of a run ending at end_run as a chain, or empty if
  // they are not one.
  std::vector<ChainStep> chain_of(size_t first, size_t end, size_t end_run) const {
    std::vector<ChainStep> chain(end - first);
    for (size_t k = first; k < end; ++k)
      if (!chain_step(first, k, end, end_run, chain[k - first])) return {};
    return chain;
  }

  void plan_run(size_t first) {
    Run& run = runs_[first];
    run.end = first;
    while (run.end < members_.size() && members_[run.end].exact) ++run.end;
    for (size_t k = first; k < run.end;) {
      size_t stop = k + 1;
      std::vector<ChainStep> chain = chain_of(k, stop, run.end);
      for (; stop < run.end; ++stop) {  // grow the chain while it stays one
        std::vector<ChainStep> longer = chain_of(k, stop + 1, run.end);
        if (longer.empty()) break;
        chain = std::move(longer);
      }
      run.segments.push_back({k, stop, chain.empty() ? ChainProgram{} : compile_chain(chain)});
      k = stop;
    }
  }

  // Members [from, to), over `n` elements of the slice at `s` of the piece
  // at `lo`, one by one in L1.
  void run_exact_members(size_t from, size_t to, int64_t lo, int64_t s, int64_t n) {
    for (size_t m = from; m < to; ++m) {
      current_ = m;  // names the member in errors
      const Lanes& l = lanes_[m];
      const size_t size = c10::elementSize(members_[m].exact->dtype);
      char* out = const_cast<char*>(l.out.at(lo, s, size));
      const SliceOperand self{l.self.at(lo, s, size), l.self.step}, other{l.other.at(lo, s, size), l.other.step};
      // Slices start where ATen's vector loop would, so a declined one takes
      // ATen's own paths element by element.
      char* into = l.stream ? reinterpret_cast<char*>(staging_) : out;
      if (!run_exact(*members_[m].exact, into, self, other, n))
        run_with_aten(*members_[m].exact, out, self, other, n);
      else if (l.stream)
        stream_copy(out, into, n * size);
    }
  }

  // The run of exact members starting at `first`, over the piece at `lo`,
  // slice by slice, so that what one member writes the next reads from L1.
  void run_exact_run(size_t first, int64_t lo, int64_t len) {
    const Run& run = runs_[first];
    for (int64_t s = lo; s < lo + len; s += kSlice) {
      const int64_t n = std::min(kSlice, lo + len - s);
      for (const Segment& g : run.segments) {
        if (g.chain.empty()) {
          run_exact_members(g.first, g.end, lo, s, n);
          continue;
        }
        // A chain computes whole chunks in registers, up to a chunk in which
        // run_exact would decline; members compute the rest.
        current_ = g.first;
        const int64_t chunk = chain_chunk(g.chain.dtype);
        for (int64_t i = 0; i < n;) {
          i += run_chain(g.chain, s, s + i, n - i);
          const int64_t rest = std::min(chunk, n - i);
          if (rest > 0) run_exact_members(g.first, g.end, lo, s + i, rest);
          i += rest;
        }
      }
    }
  }

  // A member that calls its ATen kernel, on views of the piece at `lo`.
  void run_aten_member(size_t m, int64_t lo, int64_t len) {
    Prepared& p = prepared_[m];
    for (const Slice& s : p.slices) s.at(g_.row, lo, len);
    torch::jit::Stack stack(p.args.begin(), p.args.end());
    const ElementwiseCall& call = members_[m].call;
    if (p.result_slices.empty()) return call_kernel(call.op, *call.policy, &stack);
    // A functional member computes straight into its piece of the result (or
    // of its scratch), as unfused ones do (result_placement.h).
    std::vector<c10::IValue> into;
    for (Slice& s : p.result_slices) {
      s.at(g_.row, lo, len);
      into.emplace_back(s.view);
    }
    PlaceResults placing(into, /*enabled=*/true);
    call_kernel(call.op, *call.policy, &stack);
    placing.settle(std::move(stack));
  }

  FusedGroup& g_;
  std::vector<Member>& members_;
  const int64_t begin_, end_, piece_;
  const bool whole_;
  std::vector<at::Tensor> scratch_;
  std::vector<bool> in_slice_;
  std::vector<Prepared> prepared_;
  std::vector<Lanes> lanes_;
  std::vector<Run> runs_;
  size_t current_ = 0;  // the member running, for errors
  alignas(64) double staging_[kSlice];  // a streamed result's slice
};

} // namespace

void FusedGroup::run_range(int64_t begin, int64_t end, int64_t piece, bool whole) {
  RangeRun(*this, begin, end, piece, whole).run();
}

void FusedGroup::run() {
  if (memcheck::on())  // the device memory the group touches (memcheck.h)
    for (const auto& member : members)
      for (const Operand& o : member.operands)
        if (o.slot < 0) memcheck::viewed(reinterpret_cast<const void*>(o.range.begin));
  auto guard = below_autograd();
  follow_host_thread_count();  // the split below is the CPU's for this count
  // Nothing joined: one call over everything, as unfused, saves the pieces.
  if (members.size() == 1 && slots.empty()) return run_range(0, numel, numel, /*whole=*/true);
  // The thread ranges TensorIterator would use for one numel-long kernel.
  const auto [tasks, chunk] = split_of(numel);
  // Pieces of whole rows match unfused execution only if every thread starts
  // on a row; otherwise each member runs over everything in turn, as unfused.
  if (row > 0 && tasks > 1 && chunk % row != 0) return run_range(0, numel, numel, /*whole=*/true);
  const int64_t piece = piece_elements(*this, chunk);
  // A piece inside a thread's range starts each member's vector loop where
  // unfused execution does only at a multiple of every vector step.
  if (piece < chunk && row % kVectorStep != 0) return run_range(0, numel, numel, /*whole=*/true);
  if (tasks == 1) return run_range(0, numel, piece);
  at::parallel_for(0, tasks, 1, [&](int64_t b, int64_t e) {
    vector_math::MklOnThisThread sequential;  // library members, called inside this parallel region
    for (int64_t t = b; t < e; ++t) run_range(t * chunk, std::min(numel, (t + 1) * chunk), piece);
  });
}

} // namespace torchneuron::fusion
