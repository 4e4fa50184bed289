// Views of device memory. Device memory is host-addressable, so a CPU tensor
// over the same bytes (a host view) lets ATen's CPU kernels run on device
// tensors inside a device task, with no copy; a meta tensor with the same
// metadata (a meta view) lets the host compute output sizes before launching.
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <functional>

namespace torchneuron {

// `t` (any device) seen as a CPU tensor over the same memory. Undefined stays
// undefined. `resizable` lets a kernel grow it into fresh host memory, which
// the caller must then copy back.
at::Tensor host_view(const at::Tensor& t, bool resizable = false);
// A device tensor described by plain metadata, to be made into its host view
// later: a queued task makes its views when it runs, on the executor, so
// the host's per-operator path does not pay for them. Like the view, it
// holds no reference to the device memory (the allocator reuses memory in
// stream order).
struct DeferredHostView {
  void* data = nullptr;  // the storage's start
  size_t nbytes = 0;     // the storage's size
  caffe2::TypeMeta dtype;
  c10::SmallVector<int64_t, 5> sizes, strides;
  int64_t offset = 0;
  bool conj = false, neg = false, wrapped = false;

  static DeferredHostView of(const at::Tensor& device_tensor);
  void assign(const at::Tensor& device_tensor);  // becomes of(device_tensor), in place
  at::Tensor make(bool resizable = false) const;
};

// While alive, the host views this thread makes of one device storage share
// one host storage, as the device tensors share theirs, so
// ATen's overlap and aliasing checks (TensorIterator's partial-overlap check,
// copy_'s, is_alias_of) see what the CPU would see: x[1:] += x[:-1] raises as
// on the CPU instead of reading what it has just written. Open one around the
// views of one kernel call; scopes nest. (Meta views cannot tell: overlap
// checks compare data addresses, which meta tensors lack; see executor.cpp.)
class SharedHostStorages {
 public:
  SharedHostStorages();
  ~SharedHostStorages();
  SharedHostStorages(const SharedHostStorages&) = delete;
  SharedHostStorages& operator=(const SharedHostStorages&) = delete;
};

// Gives a device tensor that a call is about to write storage of its own if
// it shares a copy-on-write storage (torch._lazy_clone), as the first
// mutable access of a CPU kernel does. Kernels here write through host views,
// which never make that access on the device tensor. Call it on the host,
// before the call's views are taken: materialising may copy on the current
// stream.
void materialize_for_write(const at::Tensor& t);

// `t`'s metadata (sizes, strides, offset, dtype, storage size) on Meta.
at::Tensor meta_view(const at::Tensor& t);

// A `neuron` Device argument as `type` (a factory's meta pass and its task);
// any other value as it is.
inline c10::IValue device_arg_as(const c10::IValue& a, c10::DeviceType type) {
  if (a.isDevice() && a.toDevice().type() == c10::DeviceType::PrivateUse1) return c10::Device(type);
  return a;
}

// A device tensor whose metadata is that of `like` (a meta or CPU tensor).
at::Tensor empty_like_on(const at::Tensor& like, c10::DeviceIndex device);

// Applies `fn` to every tensor inside an argument or return value (Tensor,
// Tensor?, Tensor[], Tensor?[]); returns the rewritten value. The common
// cases are inline: the per-operator path passes lambdas that a std::function
// would copy to the heap, for every argument.
c10::IValue map_tensors_in_list(const c10::IValue& list, const std::function<at::Tensor(const at::Tensor&)>& fn);
void for_each_tensor_in_list(const c10::IValue& list, const std::function<void(const at::Tensor&)>& fn);

template <class F>
c10::IValue map_tensors(const c10::IValue& v, const F& fn) {
  if (v.isTensor()) return fn(v.toTensor());
  return v.isList() ? map_tensors_in_list(v, fn) : v;
}
template <class F>
void for_each_tensor(const c10::IValue& v, const F& fn) {
  if (v.isTensor()) fn(v.toTensor());
  else if (v.isList()) for_each_tensor_in_list(v, fn);
}

// Device tasks run ATen CPU kernels on host views below autograd: the views
// carry no autograd state and a task must record none.
inline c10::impl::ExcludeDispatchKeyGuard below_autograd() {
  return c10::impl::ExcludeDispatchKeyGuard(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
}

} // namespace torchneuron
