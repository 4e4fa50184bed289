#include "meta_cache.h"

#include <c10/core/DefaultDtype.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>

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

} // namespace torchneuron
