// Copies between host and device, and reading a value. These are where eager
// code meets the device's asynchrony, with CUDA's semantics:
//   host -> device   returns at once; a pageable source is staged first so the
//                    caller may reuse it; a pinned source with non_blocking=True
//                    is read by the device later (the caller must not touch it)
//   device -> host   waits for the stream, unless non_blocking=True into pinned
//                    memory, which is filled later (synchronize before reading)
//   device -> device a device task, ordered across devices by an event; on
//                    one device it may fuse with queued element-wise work (a
//                    cast in a chain: adaptive eager)
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/_local_scalar_dense_native.h>

#include "../device_state.h"
#include "../exec/fusion_offer.h"
#include "../exec/host_views.h"
#include "../exec/launch.h"
#include "../exec/op_policy.h"
#include "../host_allocator.h"
#include "explicit_ops.h"

namespace torchneuron::ops {

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  const bool src_dev = self.device().type() == kNeuron, dst_dev = dst.device().type() == kNeuron;
  TORCH_CHECK((src_dev || self.is_cpu()) && (dst_dev || dst.is_cpu()),
              "copy between ", self.device(), " and ", dst.device(), " is not supported by neuron");
  // The CPU copy's shape check, at the call wherever the copy runs.
  const auto shape = at::infer_size_dimvector(dst.sizes(), self.sizes());
  TORCH_CHECK(c10::IntArrayRef(shape) == dst.sizes(), "output with shape ", dst.sizes(),
              " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
  if (dst.numel() == 0) return dst;
  // And its early return for a copy of the same data onto itself, before any
  // overlap check (an expanded tensor's view copied onto itself).
  if (self.is_alias_of(dst) && self.storage_offset() == dst.storage_offset() && self.strides() == dst.strides() &&
      self.sizes() == dst.sizes() && self.scalar_type() == dst.scalar_type() && self.is_conj() == dst.is_conj() &&
      self.is_neg() == dst.is_neg())
    return dst;
  if (dst_dev) materialize_for_write(dst);
  if (src_dev && dst_dev) {
    // The checks of the CPU's copy, at the call as there: the device tensors
    // share what their memory shares.
    at::assert_no_internal_overlap(dst);
    at::assert_no_partial_overlap(dst, self);
    SharedHostStorages shared;  // and so do the host views the copy runs on
    rt::Stream& stream = current_runtime_stream(dst.device().index());
    if (self.device() != dst.device()) {
      rt::Event ready;
      translate_errors([&] {
        ready.record(current_runtime_stream(self.device().index()));
        ready.block(stream);
      });
    }
    if (self.device() == dst.device() && dst.numel() >= min_fusable_numel() && adaptive_eager_enabled()) {
      static const auto copy_op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
      ElementwiseCall call{copy_op, {host_view(dst), host_view(self), false}, {}, &op_policy(copy_op)};
      if (translate_errors([&] { return offer_to_fuser(stream, call); })) return dst;
    }
    enqueue_copy(stream, host_view(dst), host_view(self));
    if (self.device() != dst.device()) {
      // As CUDA's copy between devices: the source's stream waits for the
      // copy too, so memory it frees or reuses after the call (the source's
      // own block, back in its pool at once) is not read by a copy still
      // queued on the destination's stream.
      rt::Event done;
      translate_errors([&] {
        done.record(stream);
        done.block(current_runtime_stream(self.device().index()));
      });
    }
  } else if (dst_dev) {
    rt::Stream& stream = current_runtime_stream(dst.device().index());
    if (non_blocking && is_pinned(self.storage().data())) enqueue_copy(stream, host_view(dst), self);
    else write_from_host(stream, dst, self, /*owned=*/false);
  } else {
    rt::Stream& stream = current_runtime_stream(self.device().index());
    if (non_blocking && is_pinned(dst.storage().data())) {
      enqueue_copy(stream, dst, host_view(self));
    } else {
      translate_errors([&] { stream.synchronize(); });
      const_cast<at::Tensor&>(dst).copy_(host_view(self));
    }
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  translate_errors([&] { current_runtime_stream(self.device().index()).synchronize(); });
  // Device memory is host-addressable and the stream is done with it: the
  // CPU kernel reads the value in place, with no alias to make. A conjugate or
  // negative view goes through the alias, whose dispatch resolves the bit.
  if (self.is_conj() || self.is_neg()) return at::_local_scalar_dense(host_view(self));
  return at::native::_local_scalar_dense_cpu(self);
}

} // namespace torchneuron::ops
