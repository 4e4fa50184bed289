#include "meta.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <c10/core/DefaultDtype.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "host_views.h"
#include "op_policy.h"

namespace torchneuron {
namespace {

constexpr size_t kCapacity = 8192;  // signatures; the cache restarts when full

enum Tag : int64_t { kNone = 1, kTensor, kUndefined, kInt, kDouble, kBool, kString, kList, kDevice, kOther };

int64_t bits(double d) {
  int64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}

void key_tensor(const at::Tensor& t, std::vector<int64_t>& w) {
  if (!t.defined()) return w.push_back(kUndefined);
  const auto* impl = t.unsafeGetTensorImpl();
  const c10::IntArrayRef sizes = impl->sizes(), strides = impl->strides();
  const size_t dim = sizes.size(), at = w.size();
  w.resize(at + 7 + 2 * dim);  // one size check, then plain stores
  int64_t* k = w.data() + at;
  *k++ = kTensor;
  *k++ = static_cast<int64_t>(t.scalar_type());
  *k++ = static_cast<int64_t>(t.device().type());
  *k++ = (impl->is_wrapped_number() ? 1 : 0) | (t.is_conj() ? 2 : 0) | (t.is_neg() ? 4 : 0);
  *k++ = static_cast<int64_t>(dim);
  k = std::copy(sizes.begin(), sizes.end(), k);
  k = std::copy(strides.begin(), strides.end(), k);
  *k++ = impl->storage_offset();
  *k = impl->has_storage() ? static_cast<int64_t>(impl->storage().nbytes()) : -1;
}

bool key_value(const c10::IValue& v, bool float_values, std::vector<int64_t>& w) {
  if (v.isNone()) {
    w.push_back(kNone);
  } else if (v.isTensor()) {
    key_tensor(v.toTensor(), w);
  } else if (v.isInt()) {
    w.push_back(kInt);
    w.push_back(v.toInt());
  } else if (v.isDouble()) {
    w.push_back(kDouble);
    w.push_back(float_values ? bits(v.toDouble()) : 0);
  } else if (v.isBool()) {
    w.push_back(kBool);
    w.push_back(v.toBool());
  } else if (v.isString()) {
    w.push_back(kString);
    w.push_back(static_cast<int64_t>(std::hash<std::string_view>()(v.toStringView())));
  } else if (v.isDevice()) {
    w.push_back(kDevice);
    w.push_back(static_cast<int64_t>(v.toDevice().type()) * 1000 + v.toDevice().index());
  } else if (v.isList()) {
    auto list = v.toListRef();
    w.push_back(kList);
    w.push_back(static_cast<int64_t>(list.size()));
    for (const auto& e : list)
      if (!key_value(e, float_values, w)) return false;
  } else if (v.isSymInt() || v.isSymFloat() || v.isSymBool() || v.isComplexDouble()) {
    return false;  // symbolic or rare: not worth keying
  } else {
    return false;
  }
  return true;
}

struct SignatureHash {
  size_t operator()(const MetaSignature& s) const { return s.hash; }
};

struct Cache {
  std::mutex mu;
  std::unordered_map<MetaSignature, std::shared_ptr<const MetaResult>, SignatureHash> entries;
};

Cache& cache() {
  static Cache* c = new Cache();
  return *c;
}

} // namespace

bool meta_signature(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                    const std::vector<size_t>& skip, bool float_values_free, MetaSignature& out) {
  out.schema = &op.schema();
  out.words.clear();
  out.words.reserve(16 * args.size());  // no regrowth on the per-operator path
  // Factories without a dtype take the default dtype: part of the signature.
  out.words.push_back(static_cast<int64_t>(c10::get_default_dtype_as_scalartype()));
  // Kernels may return other results without grad (mkldnn_rnn_layer's workspace).
  out.words.push_back(at::GradMode::is_enabled());
  for (size_t i = 0; i < args.size(); ++i) {
    if (std::find(skip.begin(), skip.end(), i) != skip.end()) continue;
    if (!key_value(args[i], !float_values_free, out.words)) return false;
  }
  uint64_t h = reinterpret_cast<uintptr_t>(out.schema);
  for (int64_t x : out.words) h = (h ^ static_cast<uint64_t>(x)) * 0x100000001b3ull;  // FNV-style, per word
  out.hash = static_cast<size_t>(h ^ (h >> 29));
  return true;
}

std::shared_ptr<const MetaResult> meta_cache_find(const MetaSignature& sig) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.entries.find(sig);
  return it == c.entries.end() ? nullptr : it->second;
}

void meta_cache_insert(MetaSignature sig, std::shared_ptr<const MetaResult> result) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.entries.size() >= kCapacity) c.entries.clear();
  c.entries.insert_or_assign(std::move(sig), std::move(result));
}

size_t meta_cache_entries() {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.entries.size();
}

namespace {

// The non-empty out= arguments of a meta stack. A CPU kernel that resizes
// one warns ("An output with one or more elements was resized"); so would
// its meta kernel (ATen's resize_output, Python's out wrapper), and the call
// would warn twice. A meta pass sizes such an out from an empty one, which
// resizes silently.
c10::SmallVector<size_t, 2> sized_outs(const c10::OperatorHandle& op, const OpPolicy& policy,
                                       const torch::jit::Stack& meta) {
  c10::SmallVector<size_t, 2> out;
  for (size_t i : policy.written)
    if (op.schema().arguments()[i].is_out() && meta[i].isTensor() && meta[i].toTensor().defined() &&
        meta[i].toTensor().numel() != 0)
      out.push_back(i);
  return out;
}

// A uint8 index is a mask to ATen, as a bool one (deprecated, with a
// warning). PyTorch's meta kernel of index.Tensor lists int8 where it means
// uint8 and refuses it, a failure that would read as a meta kernel stricter
// than the CPU's: seen as the bool mask it is, the index fails the meta pass
// as data-dependent, and the call runs synchronously like any mask index.
c10::IValue byte_masks_as_bool(const c10::IValue& indices) {
  return map_tensors(indices, [](const at::Tensor& t) {
    return t.defined() && t.scalar_type() == at::kByte ? t.to(at::kBool) : t;
  });
}

// Which failure an exception of a meta pass is. A missing kernel by types:
// PyTorch's Meta fallback raises NotImplementedError for an operator the
// dispatcher has no Meta kernel for (OpPolicy::has_meta_kernel). Data
// dependence by the words of the meta functions that refuse it (nonzero's,
// reached through index with a mask, and the fake-tensor exceptions): no
// type tells it apart. tests/test_executor.py pins both classes, so a
// PyTorch upgrade that changes them fails a test instead of queuing less.
MetaFailure classify(const OpPolicy& policy, const std::exception& e) {
  const std::string what = e.what();
  if (what.find("data-independent") != std::string::npos || what.find("data-dependent") != std::string::npos ||
      what.find("DynamicOutputShape") != std::string::npos)
    return MetaFailure::DataDependent;
  if (!policy.has_meta_kernel && dynamic_cast<const c10::NotImplementedError*>(&e)) return MetaFailure::NoMetaKernel;
  return MetaFailure::Other;
}

} // namespace

MetaFailure run_meta(const c10::OperatorHandle& op, const OpPolicy& policy, c10::ArrayRef<c10::IValue> args,
                     std::shared_ptr<const MetaResult>& result) {
  // The key is built in per-thread scratch whose words keep their capacity:
  // a hit allocates nothing.
  static thread_local MetaSignature scratch;
  const bool cacheable = meta_signature(op, args, policy.generators, policy.float_values_free, scratch);
  if (cacheable) {
    if ((result = meta_cache_find(scratch))) return MetaFailure::None;
  }
  MetaSignature sig;  // the meta kernel may reach this thread's scratch again
  if (cacheable) sig = scratch;
  torch::jit::Stack meta;
  std::vector<at::Tensor> meta_written;
  for (size_t i = 0; i < args.size(); ++i) {
    if (policy.is_generator(i)) {
      meta.emplace_back();
      continue;
    }
    // CPU scalars stay on the CPU, as kernels (and Python meta functions)
    // expect them next to device tensors.
    meta.push_back(map_tensors(device_arg_as(args[i], c10::kMeta), [](const at::Tensor& t) {
      return t.defined() && t.is_cpu() && t.dim() == 0 ? t : meta_view(t);
    }));
  }
  if (policy.host_indices)
    for (size_t i = 0; i < meta.size(); ++i)
      if (policy.is_tensor_list[i]) meta[i] = byte_masks_as_bool(meta[i]);
  MetaFailure failure;
  try {
    auto guard = below_autograd();
    if (policy.meta_check) policy.meta_check(meta);
    auto call = [&](torch::jit::Stack& stack) {
      if (policy.aten_meta) policy.aten_meta->callBoxed(op, c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
      else op.callBoxed(&stack);
    };
    const auto sized = sized_outs(op, policy, meta);
    bool resized = false;
    if (!sized.empty()) {
      torch::jit::Stack probe = meta;  // the call leaves its results in place of its arguments
      for (size_t i : sized) probe[i] = at::empty({0}, probe[i].toTensor().options());
      std::vector<at::Tensor> probe_written;
      for (size_t i : policy.written)
        probe_written.push_back(probe[i].isTensor() ? probe[i].toTensor() : at::Tensor());
      try {
        call(probe);
        for (size_t k = 0; k < policy.written.size(); ++k) {
          const size_t i = policy.written[k];
          if (std::find(sized.begin(), sized.end(), i) != sized.end())
            resized |= probe_written[k].sizes() != meta[i].toTensor().sizes();
        }
      } catch (const std::exception&) {
        // A meta kernel that refuses an empty out: the outs themselves decide.
      }
      // An out the call resizes is the CPU kernel's to resize (the executor
      // runs such calls synchronously). Outs already of their results' sizes
      // keep their strides, which the CPU kernel writes as they are: the
      // pass then runs again on the outs themselves.
      if (resized) meta = std::move(probe), meta_written = std::move(probe_written);
    }
    if (!resized) {
      for (size_t i : policy.written)
        meta_written.push_back(meta[i].isTensor() ? meta[i].toTensor() : at::Tensor());
      call(meta);
    }
    result = std::make_shared<const MetaResult>(MetaResult{std::move(meta), std::move(meta_written)});
    if (cacheable) meta_cache_insert(std::move(sig), result);
    return MetaFailure::None;
  } catch (const std::exception& e) {
    failure = classify(policy, e);
    if (std::getenv("TORCHNEURON_DEBUG_META"))
      std::fprintf(stderr, "[torchneuron] meta pass of %s failed: %s\n", op.schema().name().c_str(), e.what());
  }
  if (failure == MetaFailure::NoMetaKernel) policy.learned.no_meta = true;
  return failure;
}

namespace {

// A tensor's layout as TensorIterator and meta kernels read it: per
// dimension whether it is empty, of size 1 or broadcast (stride 0), and the
// order of the other dimensions' strides (with ties), plus its flags.
uint64_t layout_class(const at::Tensor& t) {
  const auto* impl = t.unsafeGetTensorImpl();
  const c10::IntArrayRef sizes = impl->sizes(), strides = impl->strides();
  uint64_t h = (impl->is_contiguous() ? 1 : 0) | (impl->is_non_overlapping_and_dense() ? 2 : 0) |
               (t.is_conj() ? 4 : 0) | (t.is_neg() ? 8 : 0);
  int8_t order[64];
  size_t n = 0;
  for (size_t d = 0; d < sizes.size() && d < 64; ++d) {
    const uint64_t kind = sizes[d] == 0 ? 0 : sizes[d] == 1 ? 1 : strides[d] == 0 ? 2 : 3;
    h = h * 4 + kind;
    // A size-1 dimension's stride means nothing, but meta kernels that copy
    // strides keep it: whether it is the one row-major order gives it.
    if (kind == 1) h = h * 2 + (strides[d] == (d + 1 < sizes.size() ? strides[d + 1] * sizes[d + 1] : 1));
    if (kind != 3) continue;
    size_t k = n++;  // insertion by falling stride: ranks are small
    for (; k > 0 && strides[order[k - 1]] < strides[d]; --k) order[k] = order[k - 1];
    order[k] = static_cast<int8_t>(d);
  }
  for (size_t k = 0; k < n; ++k)
    h = h * 131 + static_cast<uint64_t>(order[k]) * 2 + (k > 0 && strides[order[k]] == strides[order[k - 1]]);
  return h;
}

// What a kernel may check of a Scalar's value: its sign, whether it is
// zero, integral, finite, and which dtypes hold it without overflow.
uint64_t int_class(int64_t v) {
  return (v < 0) | (v == 0) << 1 | (v >= -128 && v <= 127) << 2 | (v >= 0 && v <= 255) << 3 |
         (v >= -32768 && v <= 32767) << 4 | (v >= INT32_MIN && v <= INT32_MAX) << 5;
}

uint64_t double_class(double v) {
  const double m = std::fabs(v);
  return std::isnan(v) | std::isinf(v) << 1 | std::signbit(v) << 2 | (v == 0) << 3 | (std::trunc(v) == v) << 4 |
         (m > 65504.0) << 5 | (m > 3.3895313892515355e38) << 6 | (m > 3.4028234663852886e38) << 7;
}

uint64_t argument_signature(c10::ArrayRef<c10::IValue> args, bool int_values) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  auto tensor = [&](const at::Tensor& t) {
    mix(t.defined() ? 1 + 8 * (static_cast<uint64_t>(t.scalar_type()) + 64 * (t.dim() + 64 * (t.numel() == 0))) : 0);
    if (int_values || !t.defined()) return;
    mix(layout_class(t));
    // A Python number passed for a Tensor argument (a wrapped number, as in
    // x // 0) or a host scalar: its value, as a Scalar's.
    if (t.is_cpu() && t.dim() == 0) {
      switch (t.scalar_type()) {
        case at::kLong: return mix(int_class(*t.const_data_ptr<int64_t>()));
        case at::kDouble: return mix(double_class(*t.const_data_ptr<double>()));
        case at::kComplexDouble: {
          const auto z = *t.const_data_ptr<c10::complex<double>>();
          return mix(double_class(z.real()) + 1024 * double_class(z.imag()));
        }
        default: return;
      }
    }
  };
  // False for a value that is not a number.
  auto number = [&](const c10::IValue& a) {
    if (a.isBool()) mix(a.toBool() ? 3 : 5);
    else if (a.isInt()) mix(int_values ? static_cast<uint64_t>(a.toInt()) * 7 + 11 : 13 + 64 * int_class(a.toInt()));
    else if (a.isDouble()) mix(31 + 1024 * double_class(a.toDouble()));
    else if (a.isComplexDouble()) {
      const auto z = a.toComplexDouble();
      mix(37 + 1024 * (double_class(z.real()) + 1024 * double_class(z.imag())));
    } else return false;
    return true;
  };
  mix(at::GradMode::is_enabled() ? 23 : 29);  // as in meta_signature
  for (const auto& a : args) {
    mix(a.isNone() ? 17 : 19);
    if (a.isTensor()) tensor(a.toTensor());
    else if (number(a)) continue;
    else if (a.isString()) mix(std::hash<std::string>()(a.toStringRef()));
    else if (a.isTensorList()) { mix(a.toTensorList().size()); for (const at::Tensor& t : a.toTensorList()) tensor(t); }
    else if (a.isList()) {
      // A Scalar[] (the foreach operators' scalars) is checked per element
      // as a Scalar is (complex into a real tensor, overflow). An int[] is
      // sizes or dims: only its length counts.
      const bool scalars = !a.isIntList();
      for (const c10::IValue& e : a.toList())
        if (e.isTensor()) tensor(e.toTensor());
        else if (!scalars || !number(e)) mix(e.isNone());
    }
  }
  return h;
}
} // namespace

uint64_t verification_signature(c10::ArrayRef<c10::IValue> args) { return argument_signature(args, true); }
uint64_t call_signature(c10::ArrayRef<c10::IValue> args) { return argument_signature(args, false); }

bool results_match_meta(const OpPolicy& policy, c10::ArrayRef<c10::IValue> results, c10::ArrayRef<c10::IValue> meta) {
  for (size_t i = 0; i < results.size(); ++i) {
    if (policy.source[i] >= 0) continue;
    std::vector<at::Tensor> a, b;
    for_each_tensor(results[i], [&](const at::Tensor& t) { a.push_back(t); });
    for_each_tensor(meta[i], [&](const at::Tensor& t) { b.push_back(t); });
    if (a.size() != b.size()) return false;
    for (size_t k = 0; k < a.size(); ++k) {
      if (a[k].defined() != b[k].defined()) return false;
      if (a[k].defined() && (a[k].sizes() != b[k].sizes() || a[k].scalar_type() != b[k].scalar_type())) return false;
    }
  }
  return true;
}

} // namespace torchneuron
