// torchneuron._C's part of the stream sanitizer (torchneuron/sanitizer.py):
// its log of synchronisations and frees (../sanitizer.h), the current stream,
// and where tensors lie in device memory.
#include <ATen/Tensor.h>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include "../device_state.h"
#include "../sanitizer.h"
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
  // elsewhere, without storage or without elements.
  m.def("_sanitizer_extent", [](const at::Tensor& t) -> py::object {
    if (!t.defined() || t.device().type() != kNeuron || !t.has_storage()) return py::none();
    const int64_t n = t.numel();
    const auto base = reinterpret_cast<uintptr_t>(t.storage().data());
    if (n == 0 || base == 0) return py::none();
    int64_t last = 0;  // offset of the farthest element
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * std::abs(t.stride(d));
    const auto item = static_cast<uintptr_t>(t.element_size());
    const uintptr_t lo = base + static_cast<uintptr_t>(t.storage_offset()) * item;
    return py::make_tuple(int(t.device().index()), base, t.storage().nbytes(), lo, lo + (last + 1) * item);
  });
}

} // namespace torchneuron
