// The fuser's side of the queue: a fusable call joins the fused group at the
// stream's tail while that group waits, or starts a group of its own; frees
// reach a waiting group through runtime::OpenWork. Installed into the
// executor (../exec/fusion_offer.h) when the extension loads.
#include <memory>
#include <string>

#include "../exec/op_policy.h"
#include "../sanitizers/op_tracking.h"
#include "cost_model.h"
#include "fused_group.h"

namespace torchneuron::fusion {
namespace {

// An idle device holds a new group back this long after each operator joins
// it, for the next one: a host issues an operator in microseconds, and a
// group costs at least a pass over a million elements. A waiting host, or
// any other work queued behind the group, starts it at once.
constexpr int64_t kLingerNs = 50'000;

bool fuse(runtime::Stream& stream, ElementwiseCall& call) {
  std::optional<Candidate> c = candidate_of(call);
  if (!c) return false;
  const std::string& name = call.policy->task_name;
  bool merged = stream.amend_pending_tail([&](runtime::Task& tail) {
    auto* g = dynamic_cast<FusedGroup*>(tail.open.get());
    if (!g || g->numel != c->numel || g->members.size() >= kMaxMembers || !g->compatible(c->operands) ||
        !joining_pays(*g, *c))
      return false;
    if (c->row != 0 && g->row != 0 && c->row != g->row) return false;
    if (c->row != 0) g->row = c->row;
    tail.name += "+" + name;
    g->members.push_back({std::move(call), std::move(c->operands), std::move(c->exact)});
    if (g->members.size() == 2) record_fused(g->members.front().call.policy->task_name, true);
    record_fused(name, false);
    return true;
  });
  if (merged) return true;

  auto group = std::make_shared<FusedGroup>();
  group->numel = c->numel;
  group->row = c->row;
  runtime::Task task;
  task.name = "fused:" + name;
  group->members.push_back({std::move(call), std::move(c->operands), std::move(c->exact)});
  task.run = [group] { group->run(); };
  task.open = group;
  stream.enqueue(std::move(task));
  return true;
}

const bool installed = (install_fuser(&fuse), true);

} // namespace

void FusedGroup::on_free(const void* ptr, size_t nbytes) {
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  elide(begin, begin + nbytes);
}

int64_t FusedGroup::linger_ns() const { return kLingerNs; }

} // namespace torchneuron::fusion
