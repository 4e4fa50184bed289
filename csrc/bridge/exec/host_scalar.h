// A zero-dimensional host tensor passed to a device task (a Python number
// that PyTorch wrapped, a CPU scalar operand): its value, read at the launch
// as a copy to the device would read it, and given back to the kernel as a
// CPU tensor of the same dtype, value and wrapped-number flag. Taking the
// value costs the host a few loads; a clone would cost it a dispatched
// allocation and copy, and the executor the free of the host's block.
#pragma once

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/core/CPUAllocator.h>

#include <cstring>

namespace torchneuron {

class HostScalar {
 public:
  // Whether `t` is a host tensor a HostScalar represents exactly: dense,
  // zero-dimensional, with no lazy conjugation or negation and an ordinary
  // dtype of up to 8 bytes (small enough for a task kept inline). Other host
  // tensors are cloned.
  static bool fits(const at::Tensor& t) {
    return t.defined() && t.is_cpu() && t.dim() == 0 && t.layout() == c10::kStrided && !t.is_conj() && !t.is_neg() &&
           !c10::isQIntType(t.scalar_type()) && t.itemsize() <= sizeof(bytes_) && t.has_storage() &&
           t.const_data_ptr() != nullptr;
  }

  // `t` passed fits().
  explicit HostScalar(const at::Tensor& t)
      : dtype_(t.scalar_type()), wrapped_(t.unsafeGetTensorImpl()->is_wrapped_number()) {
    std::memcpy(bytes_, t.const_data_ptr(), t.itemsize());
  }
  HostScalar() = default;
  // The value `v` as a float32 scalar tensor, wrapped or not.
  static HostScalar float32(float v, bool wrapped) {
    HostScalar s;
    std::memcpy(s.bytes_, &v, sizeof v);
    s.dtype_ = c10::ScalarType::Float;
    s.wrapped_ = wrapped;
    return s;
  }
  // The value, which is of `dtype()`.
  template <class T>
  T value() const {
    T v;
    std::memcpy(&v, bytes_, sizeof v);
    return v;
  }

  // A CPU tensor holding the value, for a kernel call on this thread; it
  // aliases this object, which must outlive it.
  at::Tensor alias() const {
    const auto meta = c10::scalarTypeToTypeMeta(dtype_);
    c10::Storage storage(c10::Storage::use_byte_size_t(), meta.itemsize(),
                         c10::DataPtr(const_cast<unsigned char*>(bytes_), c10::Device(c10::kCPU)), nullptr, false);
    auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                      meta);
    t.unsafeGetTensorImpl()->set_sizes_contiguous({});
    if (wrapped_) t.unsafeGetTensorImpl()->set_wrapped_number(true);
    return t;
  }
  // A CPU tensor of its own, for a kernel that may keep it.
  at::Tensor tensor() const {
    at::Tensor t = at::detail::empty_cpu({}, dtype_, std::nullopt, std::nullopt, std::nullopt, std::nullopt);
    std::memcpy(t.mutable_data_ptr(), bytes_, t.itemsize());
    if (wrapped_) t.unsafeGetTensorImpl()->set_wrapped_number(true);
    return t;
  }

  c10::ScalarType dtype() const { return dtype_; }
  bool wrapped() const { return wrapped_; }

 private:
  alignas(8) unsigned char bytes_[8] = {};
  c10::ScalarType dtype_ = c10::ScalarType::Undefined;
  bool wrapped_ = false;
};

} // namespace torchneuron
