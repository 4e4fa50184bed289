// Aliases of device memory. Device memory is host-addressable, so a CPU tensor
// over the same bytes lets ATen's CPU kernels run on device tensors inside a
// device task, with no copy; a meta tensor with the same metadata lets the host
// compute output sizes before launching.
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace torchneuron {

// `t` (any device) seen as a CPU tensor over the same memory. Undefined stays
// undefined. `resizable` lets a kernel grow it into fresh host memory, which
// the caller must then copy back.
at::Tensor host_alias(const at::Tensor& t, bool resizable = false);
// `t`'s metadata (sizes, strides, offset, dtype, storage size) on Meta.
at::Tensor meta_alias(const at::Tensor& t);

// A device tensor whose metadata is that of `like` (a meta or CPU tensor).
at::Tensor empty_like_on(const at::Tensor& like, c10::DeviceIndex device);

// Applies `fn` to every tensor inside an argument or return value (Tensor,
// Tensor?, Tensor[], Tensor?[]); returns the rewritten value.
c10::IValue map_tensors(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& fn);
void for_each_tensor(const c10::IValue& v, const std::function<void(const at::Tensor&)>& fn);

// Device tasks run ATen CPU kernels on aliases below autograd: the aliases
// carry no autograd state and a task must record none.
inline c10::impl::ExcludeDispatchKeyGuard below_autograd() {
  return c10::impl::ExcludeDispatchKeyGuard(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
}

} // namespace torchneuron
