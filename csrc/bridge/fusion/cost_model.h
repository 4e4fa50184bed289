// When fusing pays, from measured costs instead of a fixed size floor.
//
// A member that joins a fused group saves the executor's cost of a task of
// its own (task_s: queueing, waking the device's thread, the boxed call, the
// intra-op threads' fork and join) and, when the group's working set leaves
// the cache, the memory traffic of the intermediate it consumes or produces.
// It costs nothing when fusion runs it in its own loops (exact arithmetic),
// and one boxed ATen call per extra piece otherwise (piece_call_s): so a
// group whose working set fits in each thread's cache runs as one piece per
// thread (each member over the range its unfused kernel would cover, minus
// the tasks), and pieces of kPiece elements only where they keep the
// intermediates in cache. What an intermediate kept in cache saves is its
// bytes at the bandwidth of where it would otherwise go: the last-level cache
// or memory.
//
// The constants are measured by benchmarks/fusion_costs.py (what it measured
// and on which host: benchmarks/RESULTS.md, "Fusion's cost model").
#pragma once

#include <cstdint>

#include "fused_group.h"

namespace torchneuron::fusion {

struct Costs {
  double task_s;              // a device task's cost beyond its kernel
  double piece_call_s;        // one boxed ATen kernel call on a piece
  double memory_bytes_per_s;  // the host's memory bandwidth, all cores
  double shared_bytes_per_s;  // the same, for data in the last-level cache
  int64_t cache_bytes;        // a thread's working set that stays in its own cache
  int64_t shared_cache_bytes; // the last-level cache
};
const Costs& costs();

// The thread ranges TensorIterator would use for one `numel`-long kernel at
// the calling thread's intra-op thread count: `tasks` ranges of `chunk`.
struct Split {
  int64_t tasks, chunk;
};
Split split_of(int64_t numel);

// Elements per piece for `group` when each thread covers `chunk` elements:
// the whole chunk when its working set stays in cache, else kPiece (whole
// rows when the group broadcasts).
int64_t piece_elements(const FusedGroup& group, int64_t chunk);

// Whether `candidate` joining `group` saves more than it costs.
bool joining_pays(const FusedGroup& group, const Candidate& candidate);

} // namespace torchneuron::fusion
