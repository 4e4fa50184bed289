// torchneuron._C._NeuronBackend: the `neuron` c10d backend
// (distributed/process_group.h), made by torchneuron/distributed.py around a
// gloo backend.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "../distributed/process_group.h"
#include "bindings.h"

namespace py = pybind11;

namespace torchneuron {

void bind_distributed(py::module_& m) {
  py::module_::import("torch._C._distributed_c10d");  // c10d::Backend's Python type, the base class
  py::class_<NeuronBackend, c10d::Backend, c10::intrusive_ptr<NeuronBackend>>(m, "_NeuronBackend")
      .def(py::init([](const c10::intrusive_ptr<c10d::Backend>& gloo, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<NeuronBackend>(gloo, rank, size, timeout);
           }),
           py::arg("gloo"), py::arg("rank"), py::arg("size"), py::arg("timeout"))
      // the gloo backend's options; torchneuron/distributed.py makes the `options` split_group copies from it
      .def_property_readonly("_gloo_options", &NeuronBackend::getBackendOptions);
}

} // namespace torchneuron
