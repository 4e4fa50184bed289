// Op tracking (op_tracking.h): one counter slot per operator name, made once
// and kept for the process, so the per-call count is one atomic increment;
// the rest (fused members, elided intermediates, first-fallback warnings)
// is rare and takes a lock.
#include "op_tracking.h"

#include <cstdlib>
#include <mutex>
#include <unordered_set>
#include <unordered_map>

namespace torchneuron {
namespace {

std::string name_of(const c10::OperatorName& op) {
  return op.overload_name.empty() ? op.name : op.name + "." + op.overload_name;
}

struct Tracker {
  std::mutex mu;
  std::unordered_map<c10::OperatorName, OpCounter> counts;  // node-based: slots never move
  std::unordered_set<c10::OperatorName> warned;
  std::map<std::string, int64_t> fused;
  int64_t groups = 0;
  int64_t elided = 0;
};

Tracker& tracker() {
  static Tracker* t = new Tracker();
  return *t;
}

} // namespace

OpCounter& op_counter(const c10::OperatorName& op) {
  auto& t = tracker();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.counts.try_emplace(op).first->second;
}

void record_execution(const c10::OperatorName& op, Execution how) { record_execution(op_counter(op), how); }

bool first_fallback(const c10::OperatorName& op) {
  auto& t = tracker();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.warned.insert(op).second;
}

bool strict_fallback() {
  static const bool strict = [] {
    const char* v = std::getenv("TORCHNEURON_STRICT_FALLBACK");
    return v && std::string(v) == "1";
  }();
  return strict;
}

std::map<std::string, int64_t> executed_ops() {
  auto& t = tracker();
  std::lock_guard<std::mutex> lock(t.mu);
  std::map<std::string, int64_t> out;
  for (auto& [op, c] : t.counts)
    if (int64_t n = c.executed.load(std::memory_order_relaxed)) out[name_of(op)] += n;
  return out;
}

std::map<std::string, int64_t> fallback_ops() {
  auto& t = tracker();
  std::lock_guard<std::mutex> lock(t.mu);
  std::map<std::string, int64_t> out;
  for (auto& [op, c] : t.counts)
    if (int64_t n = c.fallback.load(std::memory_order_relaxed)) out[name_of(op)] += n;
  return out;
}

void record_fused(const std::string& op, bool starts_group) {
  auto& t = tracker();
  std::lock_guard<std::mutex> lock(t.mu);
  ++t.fused[op];
  if (starts_group) ++t.groups;
}

std::map<std::string, int64_t> fused_ops() {
  auto& t = tracker();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.fused;
}

int64_t fused_groups() {
  auto& t = tracker();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.groups;
}

void record_elided() {
  auto& t = tracker();
  std::lock_guard<std::mutex> lock(t.mu);
  ++t.elided;
}

int64_t elided_intermediates() {
  auto& t = tracker();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.elided;
}

void clear_op_tracking() {
  auto& t = tracker();
  std::lock_guard<std::mutex> lock(t.mu);
  for (auto& [op, c] : t.counts) {  // zeroed, not erased: callers hold the slots
    c.executed.store(0, std::memory_order_relaxed);
    c.fallback.store(0, std::memory_order_relaxed);
  }
  t.fused.clear();
  t.groups = 0;
  t.elided = 0;
}

} // namespace torchneuron
