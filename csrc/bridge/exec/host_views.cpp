#include "host_views.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/COW.h>

#include "../device_state.h"
#include "../sanitizers/memcheck.h"

namespace torchneuron {
namespace {

// The host storages of the open SharedHostStorages scopes of this thread.
// They wrap device memory without owning it: a scope lives no longer than its
// call.
struct SharedStorages {
  int depth = 0;
  c10::SmallVector<c10::Storage, 8> storages;

  c10::Storage find_or_make(void* data, size_t nbytes);
};
thread_local SharedStorages shared;

c10::Storage host_storage(void* data, size_t nbytes, bool resizable) {
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(data, c10::Device(c10::kCPU)),
                      resizable ? c10::GetCPUAllocator() : nullptr, resizable);
}



at::Tensor view_with(const at::Tensor& t, c10::Storage storage, c10::DispatchKey key) {
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), t.dtype());
  auto* impl = out.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  impl->_set_conj(t.is_conj());
  impl->_set_neg(t.is_neg());
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) impl->set_wrapped_number(true);
  return out;
}

} // namespace

void materialize_for_write(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return;
  const c10::Storage& storage = t.storage();
  if (c10::impl::cow::is_cow_data_ptr(storage.data_ptr())) storage.unsafeGetStorageImpl()->mutable_data();
}

at::Tensor host_view(const at::Tensor& t, bool resizable) {
  if (!t.defined() || (t.is_cpu() && !resizable)) return t;
  return DeferredHostView::of(t).make(resizable);
}

DeferredHostView DeferredHostView::of(const at::Tensor& t) {
  DeferredHostView d;
  d.assign(t);
  return d;
}

void DeferredHostView::assign(const at::Tensor& t) {
  const c10::Storage& storage = t.storage();
  data = const_cast<void*>(storage.data());
  nbytes = storage.nbytes();
  dtype = t.dtype();
  sizes.assign(t.sizes().begin(), t.sizes().end());
  strides.assign(t.strides().begin(), t.strides().end());
  offset = t.storage_offset();
  conj = t.is_conj();
  neg = t.is_neg();
  wrapped = t.unsafeGetTensorImpl()->is_wrapped_number();
}

// Resizable, as a resizable view of it may be asked for: when a kernel grows
// an out= argument that shares memory with an input, the input's view moves
// with it, as on the CPU, where the two share one storage too.
c10::Storage SharedStorages::find_or_make(void* data, size_t nbytes) {
  for (const c10::Storage& s : storages)
    if (s.data() == data) return s;
  return storages.emplace_back(host_storage(data, nbytes, true));
}

SharedHostStorages::SharedHostStorages() { ++shared.depth; }

SharedHostStorages::~SharedHostStorages() {
  if (--shared.depth == 0) shared.storages.clear();
}

at::Tensor DeferredHostView::make(bool resizable) const {
  if (memcheck::on()) memcheck::viewed(data);
  // Empty storages (no data) share nothing: two empty out= arguments grow apart.
  c10::Storage storage =
      shared.depth > 0 && data ? shared.find_or_make(data, nbytes) : host_storage(data, nbytes, resizable);
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                      dtype);
  auto* impl = out.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(sizes, strides, offset);
  impl->_set_conj(conj);
  impl->_set_neg(neg);
  if (wrapped) impl->set_wrapped_number(true);
  return out;
}

at::Tensor meta_view(const at::Tensor& t) {
  if (!t.defined()) return t;
  c10::Storage storage(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                       c10::DataPtr(nullptr, c10::Device(c10::kMeta)), c10::GetAllocator(c10::kMeta), true);
  return view_with(t, std::move(storage), c10::DispatchKey::Meta);
}

at::Tensor empty_like_on(const at::Tensor& like, c10::DeviceIndex device) {
  // The allocator serves the current device. Usually it already is `device`
  // (the operator's guard set it): then no guard, which costs virtual calls.
  std::optional<c10::DeviceGuard> guard;
  if (current_device() != device) guard.emplace(c10::Device(kNeuron, device));
  auto* allocator = c10::GetAllocator(kNeuron);
  const c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  if (like.storage_offset() == 0 && !like.is_conj() && !like.is_neg())
    return memcheck::named(
        at::detail::empty_strided_generic(like.sizes(), like.strides(), allocator, keys, like.scalar_type()));
  // Rare: a result offset into its storage, or with a conj/neg bit. Keep it all.
  size_t nbytes = like.storage().nbytes();
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, allocator->allocate(nbytes), allocator, true);
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), keys, like.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  out.unsafeGetTensorImpl()->_set_conj(like.is_conj());
  out.unsafeGetTensorImpl()->_set_neg(like.is_neg());
  return memcheck::named(out);
}

c10::IValue map_tensors_in_list(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& fn) {
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(fn(t));
    return out;
  }
  if (v.isList()) {  // Tensor?[]
    auto list = v.toList();
    if (list.empty() || !(list.get(0).isTensor() || list.get(0).isNone())) return v;
    c10::List<std::optional<at::Tensor>> out;
    for (const c10::IValue& e : list) out.push_back(e.isTensor() ? std::optional<at::Tensor>(fn(e.toTensor())) : std::nullopt);
    return out;
  }
  return v;
}

void for_each_tensor_in_list(const c10::IValue& v, const std::function<void(const at::Tensor&)>& fn) {
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) fn(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toList())
      if (e.isTensor()) fn(e.toTensor());
  }
}

} // namespace torchneuron
