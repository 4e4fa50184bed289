#include "cost_model.h"

#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>  // GRAIN_SIZE: the split unfused kernels use

#include <algorithm>
#include <set>

namespace torchneuron::fusion {
namespace {

// Bytes per element of the iteration space that a piece touches: each
// distinct tensor cut into pieces, and each scratch slot.
int64_t bytes_per_element(const FusedGroup& group, const std::vector<Operand>* extra) {
  std::set<uintptr_t> seen;
  int64_t bytes = 0;
  auto count = [&](const Operand& o) {
    if (o.slot < 0 && o.cover == Cover::Full && seen.insert(o.range.begin).second) bytes += int64_t(o.range.itemsize);
  };
  for (const Member& m : group.members)
    for (const Operand& o : m.operands) count(o);
  if (extra)
    for (const Operand& o : *extra) count(o);
  for (const FusedGroup::Slot& s : group.slots) bytes += int64_t(c10::elementSize(s.dtype));
  return bytes;
}

// Pieces of the whole chunk when its working set (`bytes` an element) stays
// in cache, else of kPiece elements, whole rows when the group broadcasts.
int64_t piece_of(int64_t row, int64_t chunk, int64_t bytes) {
  if (chunk * bytes <= costs().cache_bytes) return chunk;
  return row == 0 ? kPiece : std::max<int64_t>(1, kPiece / row) * row;
}

int64_t pieces_per_thread(const FusedGroup& group, const Candidate* joining) {
  const int64_t chunk = split_of(group.numel).chunk;
  const int64_t row = group.row != 0 || !joining ? group.row : joining->row;
  const int64_t piece = piece_of(row, chunk, bytes_per_element(group, joining ? &joining->operands : nullptr));
  return (chunk + piece - 1) / piece;
}

} // namespace

// Measured by benchmarks/fusion_costs.py, medians of its runs rounded (the
// runs, their host and load: benchmarks/RESULTS.md, "Fusion's cost model").
const Costs& costs() {
  static const Costs c{
      /*task_s=*/20e-6,
      /*piece_call_s=*/0.35e-6,
      /*memory_bytes_per_s=*/11e9,
      /*shared_bytes_per_s=*/55e9,
      /*cache_bytes=*/512 << 10,
      /*shared_cache_bytes=*/32 << 20,
  };
  return c;
}

Split split_of(int64_t numel) {
  const int64_t grain = at::internal::GRAIN_SIZE;
  const int64_t threads = at::get_num_threads();
  const int64_t tasks = (numel < grain || threads == 1) ? 1 : std::min(threads, (numel + grain - 1) / grain);
  return {tasks, (numel + tasks - 1) / tasks};
}

int64_t piece_elements(const FusedGroup& group, int64_t chunk) {
  return piece_of(group.row, chunk, bytes_per_element(group, nullptr));
}

bool joining_pays(const FusedGroup& group, const Candidate& candidate) {
  auto aten_members = [](const FusedGroup& g) {
    return int64_t(std::count_if(g.members.begin(), g.members.end(), [](const Member& m) { return !m.exact; }));
  };
  const int64_t before = pieces_per_thread(group, nullptr), after = pieces_per_thread(group, &candidate);
  // Extra boxed calls per thread: every ATen member runs once per piece.
  const int64_t calls = (after - 1) * (aten_members(group) + !candidate.exact) - (before - 1) * aten_members(group);
  if (calls <= 0) return true;
  size_t itemsize = 1;
  for (const Operand& o : candidate.operands) itemsize = std::max(itemsize, o.range.itemsize);
  // The intermediate it reads or writes stays in a thread's cache: written
  // once and read once less from the last-level cache, or from memory when
  // the group's tensors do not fit there.
  const Costs& k = costs();
  const int64_t total = group.numel * bytes_per_element(group, &candidate.operands);
  const double bandwidth = total <= k.shared_cache_bytes ? k.shared_bytes_per_s : k.memory_bytes_per_s;
  const double saved = k.task_s + 2.0 * double(group.numel * int64_t(itemsize)) / bandwidth;
  return saved > double(calls) * k.piece_call_s;
}

} // namespace torchneuron::fusion
