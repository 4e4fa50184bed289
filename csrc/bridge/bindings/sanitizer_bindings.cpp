// torchneuron._C's part of the stream sanitizer (torchneuron/sanitizers/stream.py):
// its log of synchronisations and frees (../sanitizers/stream_sanitizer.h), the current stream,
// and where tensors lie in device memory.
#include <ATen/NestedTensorImpl.h>
#include <ATen/Tensor.h>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include "../device_state.h"
#include "../sanitizers/stream_sanitizer.h"
#include "bindings.h"

namespace py = pybind11;

namespace torchneuron {

void bind_sanitizer(py::module_& m) {
  m.def("_sanitizer_log", [](bool enabled) { sanitizer::set_on(enabled); });
  // [(kind, device, stream, ptr, size, used_on)] in the order they happened;
  // kind is sanitizer::Kind's number.
  m.def("_sanitizer_drain", [] {
    py::list out;
    for (auto& r : sanitizer::drain())
      out.append(py::make_tuple(int(r.kind), r.device, r.stream, r.ptr, r.size, py::tuple(py::cast(r.used_on))));
    return out;
  });
  m.def("_sanitizer_current_stream", [](int device) { return int(current_stream(device).id()); });
  // Where a neuron tensor's elements lie: (device, storage address, storage
  // bytes, first byte, end byte) with absolute addresses; None for a tensor
  // elsewhere, without storage or without elements. A nested tensor's extent
  // spans its components (each a strided view of the one buffer).
  m.def("_sanitizer_extent", [](const at::Tensor& t) -> py::object {
    if (!t.defined() || t.device().type() != kNeuron || !t.has_storage()) return py::none();
    const auto base = reinterpret_cast<uintptr_t>(t.storage().data());
    if (t.numel() == 0 || base == 0) return py::none();
    const auto item = static_cast<uintptr_t>(t.element_size());
    int64_t first = INT64_MAX, end = 0;  // in elements of the storage
    auto cover = [&](int64_t offset, c10::IntArrayRef sizes, c10::IntArrayRef strides) {
      int64_t last = offset;  // the farthest element
      for (size_t d = 0; d < sizes.size(); ++d) {
        if (sizes[d] == 0) return;
        last += (sizes[d] - 1) * std::abs(strides[d]);
      }
      first = std::min(first, offset);
      end = std::max(end, last + 1);
    };
    if (t.is_nested()) {
      const auto* nt = at::native::get_nested_tensor_impl(t);
      const at::Tensor &sizes = nt->get_nested_sizes(), &strides = nt->get_nested_strides();
      const int64_t* offsets = nt->get_storage_offsets().const_data_ptr<int64_t>();
      for (int64_t i = 0; i < sizes.size(0); ++i)
        cover(offsets[i], c10::IntArrayRef(sizes[i].const_data_ptr<int64_t>(), sizes.size(1)),
              c10::IntArrayRef(strides[i].const_data_ptr<int64_t>(), strides.size(1)));
    } else {
      cover(t.storage_offset(), t.sizes(), t.strides());
    }
    if (end == 0) return py::none();
    return py::make_tuple(int(t.device().index()), base, t.storage().nbytes(), base + uintptr_t(first) * item,
                          base + uintptr_t(end) * item);
  });
}

} // namespace torchneuron
