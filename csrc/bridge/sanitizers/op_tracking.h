// Which operators ran on the device and how: torchneuron.get_executed_ops(),
// get_fallback_ops(), clear_op_tracking().
//
// The fallback is the one way an operator can run without being queued: when
// its output sizes cannot be known before it runs (no meta kernel), the host
// waits for the stream and runs it on the device memory in place. It warns
// once per operator and TORCHNEURON_STRICT_FALLBACK=1 makes it an error.
// Operators whose outputs depend on data (nonzero, unique, .item(), ...) wait
// for the stream as on every accelerator and are not counted as fallbacks.
#pragma once

#include <ATen/core/operator_name.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

namespace torchneuron {

enum class Execution { Queued, Synchronizing, Fallback };

// One operator's counts. A slot is made once per operator name and lives as
// long as the process (clear_op_tracking zeroes it), so a caller may keep a
// pointer to it and count each call with an atomic increment: no lock and no
// hashing of the name on the per-operator path.
struct OpCounter {
  std::atomic<int64_t> executed{0};
  std::atomic<int64_t> fallback{0};
};
OpCounter& op_counter(const c10::OperatorName& op);

inline void record_execution(OpCounter& counter, Execution how) {
  counter.executed.fetch_add(1, std::memory_order_relaxed);
  if (how == Execution::Fallback) counter.fallback.fetch_add(1, std::memory_order_relaxed);
}
void record_execution(const c10::OperatorName& op, Execution how);
// True the first time a given operator falls back (to warn once).
bool first_fallback(const c10::OperatorName& op);
bool strict_fallback();

// Adaptive eager: `op` joined a fused task (`starts_group`: it was the first
// member, counted when a second one joins).
void record_fused(const std::string& op, bool starts_group);
// Adaptive eager: a fused task's intermediate nobody held was never written.
void record_elided();

std::map<std::string, int64_t> executed_ops();
std::map<std::string, int64_t> fused_ops();   // op -> times it ran fused
int64_t fused_groups();                       // fused tasks of two or more ops
int64_t elided_intermediates();               // fused intermediates kept out of memory
std::map<std::string, int64_t> fallback_ops();
void clear_op_tracking();

} // namespace torchneuron
