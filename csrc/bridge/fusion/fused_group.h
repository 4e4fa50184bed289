// Adaptive eager execution: element-wise operators queued behind busy device
// work (and a row-wise one closing the chain: softmax, layer norm, a sum or a
// max over the last dimension) are merged into one device task, a fused
// group, that walks memory once, in cache-sized pieces, applying every member
// to each piece.
//
// Results are bit-identical to unfused execution, by construction: each member
// runs the same CPU kernel, on the same thread ranges that kernel would use
// for the whole tensor (TensorIterator's split), cut into pieces that start
// where its vector loop would anyway (the start of a thread's range, or a
// multiple of every vector step after it), so each element takes the same
// (vector or scalar) code path. Operands are contiguous and cover the whole iteration
// space or broadcast over it as a row (a bias), a column (a row statistic) or
// one element. A group that broadcasts or has a row-wise member is cut into
// pieces of whole rows, which row-wise kernels compute row by row exactly as
// in one call; when threads would not start on a row, the members run one
// after another over everything, as unfused. Tensors in a group coincide or
// are disjoint, so no member reads an element another has not produced yet.
// An intermediate freed while the task still waits never reaches memory.
// Members that are exact arithmetic (../kernels/exact_arithmetic.h) run in
// fusion's own loops, chained in registers where they can be.
//
// "Adaptive": a call fuses only into a task still waiting in the queue, so
// fusion happens exactly when the host runs ahead of the device.
//
// The fuser's files: planning.cpp (whether and how a call joins a group),
// cost_model.cpp (whether joining pays, and the pieces' size), execution.cpp
// (running a group), fuser.cpp (the queue: merging, frees).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "../exec/fusion_offer.h"
#include "../kernels/exact_arithmetic.h"
#include "runtime/task.h"

namespace torchneuron::fusion {

constexpr int64_t kVectorStep = 128;    // a multiple of every vector loop's step, in elements
constexpr int64_t kPiece = 1 << 15;     // elements per piece where pieces pay (cost_model.h): a multiple of kVectorStep
constexpr int64_t kSlice = 1 << 10;     // elements per slice of exact members: their operands stay in L1
constexpr size_t kMaxMembers = 16;      // a bound on the fusion window

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
  std::vector<Operand> operands;         // reads before writes
  std::optional<ExactArithmetic> exact;  // runs in fusion's own loops
};

// A call prepared to join a group: its operands and how it covers the space.
struct Candidate {
  int64_t numel = 0;
  int64_t row = 0;  // row length its broadcasting needs, 0: none
  std::vector<Operand> operands;
  std::optional<ExactArithmetic> exact;
};

// A fused task's work. It stays open while queued (runtime::OpenWork): later
// calls join it, and frees of its intermediates elide them.
struct FusedGroup final : runtime::OpenWork {
  int64_t numel = 0;
  int64_t row = 0;  // row length when a member broadcasts, else 0
  std::vector<Member> members;
  struct Slot {
    c10::ScalarType dtype;
    size_t last_use;  // the last member to touch the intermediate living there
  };
  std::vector<Slot> slots;  // scratch, shared by intermediates whose lives do not overlap

  bool compatible(const std::vector<Operand>& operands) const;
  // The tensor at [begin, end) was freed and nothing outside the group can
  // read it any more: its uses move to a scratch slot if the group writes it first.
  void elide(uintptr_t begin, uintptr_t end);
  void run();
  // [begin, end) is one thread's range of unfused kernels, unless `whole`.
  void run_range(int64_t begin, int64_t end, int64_t piece, bool whole = false);

  void on_free(const void* ptr, size_t nbytes) override;
  int64_t linger_ns() const override;
};

// planning.cpp: `call` as a candidate member, or nullopt if it cannot fuse.
// Rewrites a row-wise call's dimension argument for pieces of [rows, row].
std::optional<Candidate> candidate_of(ElementwiseCall& call);

} // namespace torchneuron::fusion
