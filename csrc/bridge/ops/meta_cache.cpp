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
  w.push_back(kTensor);
  w.push_back(static_cast<int64_t>(t.scalar_type()));
  w.push_back(static_cast<int64_t>(t.device().type()));
  w.push_back((t.unsafeGetTensorImpl()->is_wrapped_number() ? 1 : 0) | (t.is_conj() ? 2 : 0) |
              (t.is_neg() ? 4 : 0));
  w.push_back(t.dim());
  for (auto s : t.sizes()) w.push_back(s);
  for (auto s : t.strides()) w.push_back(s);
  w.push_back(t.storage_offset());
  w.push_back(t.has_storage() ? static_cast<int64_t>(t.storage().nbytes()) : -1);
}

bool key_value(const c10::IValue& v, std::vector<int64_t>& w) {
  if (v.isNone()) {
    w.push_back(kNone);
  } else if (v.isTensor()) {
    key_tensor(v.toTensor(), w);
  } else if (v.isInt()) {
    w.push_back(kInt);
    w.push_back(v.toInt());
  } else if (v.isDouble()) {
    w.push_back(kDouble);
    w.push_back(bits(v.toDouble()));
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
      if (!key_value(e, w)) return false;
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
                    const std::vector<size_t>& skip, MetaSignature& out) {
  out.schema = &op.schema();
  out.words.clear();
  out.words.reserve(16 * args.size());  // no regrowth on the per-operator path
  // Factories without a dtype take the default dtype: part of the signature.
  out.words.push_back(static_cast<int64_t>(c10::get_default_dtype_as_scalartype()));
  for (size_t i = 0; i < args.size(); ++i) {
    if (std::find(skip.begin(), skip.end(), i) != skip.end()) continue;
    if (!key_value(args[i], out.words)) return false;
  }
  size_t h = std::hash<const void*>()(out.schema);
  for (int64_t x : out.words) h ^= std::hash<int64_t>()(x) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  out.hash = h;
  return true;
}

std::shared_ptr<const MetaResult> meta_cache_find(const MetaSignature& sig) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.entries.find(sig);
  return it == c.entries.end() ? nullptr : it->second;
}

void meta_cache_insert(MetaSignature sig, MetaResult result) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.entries.size() >= kCapacity) c.entries.clear();
  c.entries.insert_or_assign(std::move(sig), std::make_shared<const MetaResult>(std::move(result)));
}

} // namespace torchneuron
