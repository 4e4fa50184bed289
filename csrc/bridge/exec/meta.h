// The meta pass: before a call is queued, the host learns its results' sizes,
// strides and dtypes by running the operator's meta kernel on meta views of
// the arguments. Output metadata is a pure function of the operator and its
// arguments' metadata, and training loops repeat the same calls every step,
// so results are cached per signature: the meta kernel runs once and later
// calls cost a hash lookup. Where PyTorch made an operator's Meta kernel a
// Python one, the pass calls ATen's C++ meta kernel instead (aten_meta.h).
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <memory>
#include <vector>

namespace torchneuron {

struct OpPolicy;

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

// Why a meta pass predicted nothing: the operator has no meta kernel (a
// property of the operator: it never queues), its outputs depend on the data
// for these inputs (a boolean mask index, ...), or something else (a meta
// kernel stricter than the CPU kernel, or a user error that the CPU kernel
// will then raise).
enum class MetaFailure { None, NoMetaKernel, DataDependent, Other };

// The meta pass of `op` on `args` (device tensors and host scalars), from the
// cache when it can be; `result` is set unless it fails.
MetaFailure run_meta(const c10::OperatorHandle& op, const OpPolicy& policy, c10::ArrayRef<c10::IValue> args,
                     std::shared_ptr<const MetaResult>& result);

// Verification (OpPolicy::verify_meta): what can make a meta kernel and the
// CPU kernel disagree on result metadata (dtypes, ranks, empty or absent
// tensors, flags, modes, strings, the grad mode; not sizes, so that shape-varying workloads
// do not re-verify), and whether results computed by the CPU kernel have the
// sizes and dtypes the meta pass predicted for each fresh result.
uint64_t verification_signature(c10::ArrayRef<c10::IValue> args);
// What decides whether the CPU kernel accepts a call without looking at the
// data, and the metadata of its results: the dtypes it is built for, flags,
// modes, strings, which arguments are absent, each tensor's layout class
// (dimension order, size-0, size-1 and broadcast dimensions) and the value
// class of each Scalar, and of each element of a Scalar[] (sign, zero,
// integral, finite, which dtypes hold it), but not sizes or integer values,
// so that calls that differ only in sizes, dims or offsets share it. The first call of each runs synchronously, so
// that the kernel's checks raise at the call with the CPU's exception type,
// and its results teach the layouts of later calls (call_verdicts.h).
uint64_t call_signature(c10::ArrayRef<c10::IValue> args);
bool results_match_meta(const OpPolicy& policy, c10::ArrayRef<c10::IValue> results, c10::ArrayRef<c10::IValue> meta);

} // namespace torchneuron
