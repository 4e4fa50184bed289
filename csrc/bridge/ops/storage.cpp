// Tensor existence on `neuron`: allocation, views (metadata only, no device
// work), storage resizing, and which tensors may take each other's place.
#include <ATen/EmptyTensor.h>
#include <ATen/Context.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <c10/core/DeviceGuard.h>

#include <cstring>

#include "../allocator.h"
#include "../device_state.h"
#include "../exec/storage_resize.h"
#include "../sanitizers/memcheck.h"
#include "explicit_ops.h"

namespace torchneuron {

void resize_storage_bytes(const c10::Storage& storage, size_t nbytes) {
  TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
  const size_t old_bytes = storage.nbytes();
  if (nbytes == old_bytes) return;
  const auto device = storage.device().index();
  c10::DeviceGuard guard(storage.device());
  auto fresh = device_allocator().allocate(nbytes);
  auto* impl = storage.unsafeGetStorageImpl();
  auto old = std::make_shared<c10::DataPtr>(impl->set_data_ptr(std::move(fresh)));
  impl->set_nbytes(nbytes);
  size_t keep = std::min(old_bytes, nbytes);
  if (keep > 0 && old->get()) {
    void* dst = impl->mutable_data();
    // The old bytes move on the device, after the work already queued; the
    // task owns the old block until then.
    translate_errors([&] {
      current_runtime_stream(device).enqueue("resize_storage", [old, dst, keep] { std::memcpy(dst, old->get(), keep); });
    });
  }
}

namespace ops {
namespace {

c10::Device target_device(std::optional<c10::Device> device) {
  auto d = c10::device_or_default(device);
  TORCH_CHECK(d.type() == kNeuron, "expected a neuron device, got ", d);
  if (!d.has_index()) d = c10::Device(kNeuron, current_device());
  check_device_index(d.index());
  return d;
}

void check_strided(std::optional<c10::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "neuron tensors support only the strided layout, got ", c10::layout_or_default(layout));
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "only CPU tensors can be pinned");
}

constexpr c10::DispatchKeySet kNeuronKeys(c10::DispatchKey::PrivateUse1);

// torch.use_deterministic_algorithms(True) with
// torch.utils.deterministic.fill_uninitialized_memory: new memory holds NaN
// (integers: their maximum), as the CPU's and CUDA's empty and resize_ give.
bool fill_uninitialized() {
  const auto& ctx = at::globalContext();
  return ctx.deterministicAlgorithms() && ctx.deterministicFillUninitializedMemory();
}

at::Tensor filled_if_deterministic(at::Tensor t) {
  if (C10_UNLIKELY(fill_uninitialized())) at::native::fill_empty_deterministic_(t);
  return t;
}

} // namespace

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  check_strided(layout, pin_memory);
  c10::DeviceGuard guard(target_device(device));
  return memcheck::named(filled_if_deterministic(
      at::detail::empty_generic(size, &device_allocator(), kNeuronKeys, c10::dtype_or_default(dtype), memory_format)));
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  check_strided(layout, pin_memory);
  c10::DeviceGuard guard(target_device(device));
  return memcheck::named(filled_if_deterministic(at::detail::empty_strided_generic(
      size, stride, &device_allocator(), kNeuronKeys, c10::dtype_or_default(dtype))));
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  return at::native::as_strided_tensorimpl(
      self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
      storage_offset ? std::optional<int64_t>(storage_offset->expect_int()) : std::nullopt);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef sym_size,
                          std::optional<c10::MemoryFormat> memory_format) {
  auto size = C10_AS_INTARRAYREF_SLOW(sym_size);
  for (auto s : size) TORCH_CHECK(s >= 0, "Trying to create tensor with negative dimension ", s, ": ", size);
  TORCH_CHECK(!memory_format || *memory_format != c10::MemoryFormat::Preserve, "Unsupported memory format",
              *memory_format);
  auto* impl = self.unsafeGetTensorImpl();
  if (impl->sizes() != size) impl->set_sizes_contiguous(size);  // as the CPU's: the same shape keeps its strides
  if (memory_format) impl->empty_tensor_restride(*memory_format);
  size_t needed = at::detail::computeStorageNbytes(size, impl->strides(), self.itemsize(), impl->storage_offset());
  const size_t old_bytes = self.storage().nbytes();
  if (needed > old_bytes) {
    resize_storage_bytes(self.storage(), needed);
    if (C10_UNLIKELY(fill_uninitialized())) at::native::fill_resize_deterministic_(self, static_cast<int64_t>(old_bytes));
  }
  return memcheck::named(self);
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  // The CPU's checks (offset, lengths, device); it sets the storage. As the
  // CPU's resize: the sizes it has (and the strides, if given) keep its
  // strides and storage; otherwise no strides (set_(storage, offset, size))
  // is row-major.
  at::native::checkSetStorage(self, source, storage_offset, size, stride);
  if (self.sizes() == size && (!stride.data() || self.strides() == stride)) {
    self.unsafeGetTensorImpl()->set_storage_offset(storage_offset);
    return self;
  }
  const auto strides = stride.data() ? c10::DimVector(stride) : c10::contiguous_strides(size);
  size_t needed = at::detail::computeStorageNbytes(size, strides, self.itemsize(), storage_offset);
  if (needed > self.storage().nbytes()) resize_storage_bytes(self.storage(), needed);
  self.unsafeGetTensorImpl()->set_sizes_and_strides(size, strides, storage_offset);
  return self;
}

at::Tensor& set_storage_whole(at::Tensor& self, c10::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes() / self.itemsize());
  return set_storage(self, std::move(source), 0, {n}, {1});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::DeviceGuard guard(self.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, device_allocator().allocate(0), &device_allocator(), true);
  return set_storage(self, std::move(storage), 0, {0}, {1});
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kNeuron, "record_stream: expected a neuron stream, got ", stream);
  device_allocator().recordStream(self.storage().data_ptr(), stream);
}

bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  // PyTorch's own answer (TensorImpl::has_compatible_shallow_copy_type)
  // counts dense tensors of CPU, CUDA, MPS, HIP, XPU, HPU and MTIA as one
  // kind, so that Module.to() swaps a Parameter's data in place (set_data)
  // and the Parameter object survives: ties and optimizers made earlier
  // keep working. Dense `neuron` tensors belong to that kind too.
  static const c10::DispatchKeySet cpu_dense(c10::DispatchKey::CPU);
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && !t.is_quantized() &&
           (t.device().type() == kNeuron || t.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(cpu_dense));
  };
  return (dense(self) && dense(from)) || self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

} // namespace ops
} // namespace torchneuron
