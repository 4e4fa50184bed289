// A cache of meta-pass results. Output metadata is a pure function of the
// operator and its arguments' metadata, and training loops repeat the same
// calls every step, so the meta kernel (often a slow Python one) runs once per
// signature and later calls cost a hash lookup.
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <memory>
#include <vector>

namespace torchneuron {

struct MetaSignature {
  const c10::FunctionSchema* schema = nullptr;
  std::vector<int64_t> words;  // the arguments' metadata, flattened
  size_t hash = 0;
  bool operator==(const MetaSignature& o) const { return schema == o.schema && words == o.words; }
};

struct MetaResult {
  std::vector<c10::IValue> returns;   // meta tensors (or lists of them)
  std::vector<at::Tensor> written;    // written arguments after the call
  bool observed = false;              // taken from the CPU kernel's own results (its meta kernel disagrees)
};

// False if an argument's kind cannot be keyed (then the call is not cached).
// `skip` marks arguments to leave out (generators). Floating-point values
// are keyed unless `float_values_free` (then only their kind is).
bool meta_signature(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                    const std::vector<size_t>& skip, bool float_values_free, MetaSignature& out);
std::shared_ptr<const MetaResult> meta_cache_find(const MetaSignature& sig);
// Replaces an entry for `sig`. Entries are shared, never changed: a caller
// reads a hit's tensors in place instead of copying them.
void meta_cache_insert(MetaSignature sig, std::shared_ptr<const MetaResult> result);
// Signatures cached (tests: a call that should hit adds none).
size_t meta_cache_entries();

} // namespace torchneuron
