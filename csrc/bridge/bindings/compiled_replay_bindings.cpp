// torchneuron._C._CompiledReplay: the Python face of python_tasks/compiled_replay.h,
// which torchneuron/compile/replay.py records into.
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "../python_tasks/compiled_replay.h"
#include "bindings.h"

namespace py = pybind11;

namespace torchneuron {

namespace {

bool is_tensor(const c10::TypePtr& t) { return t->kind() == c10::TypeKind::TensorType; }
bool is_optional_tensor(const c10::TypePtr& t) {
  return t->kind() == c10::TypeKind::OptionalType && is_tensor(t->castRaw<c10::OptionalType>()->getElementType());
}

// (is_static, slot, byte offset, sizes, strides, dtype or None)
ReplayRef ref_from(const py::handle& h) {
  auto t = h.cast<py::tuple>();
  TORCH_CHECK(t.size() == 6, "compiled replay: a reference is (is_static, slot, rel, sizes, strides, dtype)");
  ReplayRef r;
  r.is_static = t[0].cast<bool>();
  r.slot = t[1].cast<int64_t>();
  r.rel = t[2].cast<int64_t>();
  r.sizes = t[3].cast<std::vector<int64_t>>();
  r.strides = t[4].cast<std::vector<int64_t>>();
  if (!t[5].is_none()) r.dtype = t[5].cast<at::ScalarType>();
  return r;
}

// The operator's argument stack from Python values in schema order
// (positional `args`, then `kwargs`, then defaults). Tensors that the replay
// fills in are given as None (in a tensor list: None elements).
c10::Stack stack_from(const c10::FunctionSchema& schema, const py::list& args, const py::dict& kwargs) {
  c10::Stack stack;
  const auto& formals = schema.arguments();
  TORCH_CHECK(args.size() <= formals.size(), schema.name(), ": ", args.size(), " arguments, expected at most ",
              formals.size());
  for (size_t i = 0; i < formals.size(); ++i) {
    const auto& a = formals[i];
    py::object v;
    if (i < args.size()) {
      v = args[i];
    } else if (kwargs.contains(a.name())) {
      v = kwargs[a.name().c_str()];
    } else {
      TORCH_CHECK(a.default_value().has_value(), schema.name(), ": argument ", a.name(), " is missing");
      stack.push_back(*a.default_value());
      continue;
    }
    const auto& type = a.type();
    if (is_tensor(type) || is_optional_tensor(type)) {
      stack.emplace_back(v.is_none() ? (is_tensor(type) ? c10::IValue(at::Tensor()) : c10::IValue())
                                     : c10::IValue(v.cast<at::Tensor>()));
    } else if (*type == *c10::ListType::ofTensors()) {
      c10::List<at::Tensor> list;
      for (auto e : v) list.push_back(e.is_none() ? at::Tensor() : e.cast<at::Tensor>());
      stack.emplace_back(std::move(list));
    } else if (*type == *c10::ListType::ofOptionalTensors()) {
      c10::List<std::optional<at::Tensor>> list;
      for (auto e : v)
        list.push_back(e.is_none() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(e.cast<at::Tensor>()));
      stack.emplace_back(std::move(list));
    } else {
      stack.push_back(torch::jit::toIValue(v, type));
    }
  }
  return stack;
}

// Calls a Python callable from the executor thread; its last reference may
// be dropped there too, so that also takes the GIL.
struct PyCallable {
  std::shared_ptr<py::object> fn;
  explicit PyCallable(py::object f)
      : fn(new py::object(std::move(f)), [](py::object* o) {
          if (Py_IsInitialized()) {
            py::gil_scoped_acquire gil;
            delete o;
          }   // (at interpreter exit: leaked, not touched without a GIL)
        }) {}
  void operator()(const std::vector<at::Tensor>& dyn, const std::vector<at::Tensor>& statics) const {
    py::gil_scoped_acquire gil;
    try {
      (*fn)(dyn, statics);
    } catch (py::error_already_set& e) {
      TORCH_CHECK(false, e.what());
    }
  }
};

} // namespace

void bind_compiled_replay(py::module_& m) {
  py::class_<CompiledReplay>(m, "_CompiledReplay")
      .def(py::init([](std::string name, int device, std::vector<at::Tensor> statics, const py::list& outputs) {
             std::vector<CompiledReplay::Output> outs;
             for (auto o : outputs) {
               auto t = o.cast<py::tuple>();
               outs.push_back({t[0].cast<std::vector<int64_t>>(), t[1].cast<std::vector<int64_t>>(),
                               t[2].cast<at::ScalarType>()});
             }
             return std::make_unique<CompiledReplay>(std::move(name), static_cast<c10::DeviceIndex>(device),
                                                     std::move(statics), std::move(outs));
           }),
           py::arg("name"), py::arg("device"), py::arg("statics"), py::arg("outputs"))
      .def("add_kernel",
           [](CompiledReplay& self, std::string name, int64_t fn, std::vector<int64_t> ints,
              std::vector<float> floats, const py::list& patches,
              const std::vector<std::pair<int64_t, at::Tensor>>& scalars) {
             std::vector<std::pair<int64_t, ReplayRef>> ps;
             for (auto pt : patches) {
               auto t = pt.cast<py::tuple>();
               ps.emplace_back(t[0].cast<int64_t>(), ref_from(t[1]));
             }
             self.add_kernel(std::move(name), fn, {std::move(ints), std::move(floats)}, std::move(ps), scalars);
           })
      .def("add_op",
           [](CompiledReplay& self, std::string name, const std::string& op, const std::string& overload,
              const py::list& args, const py::dict& kwargs, const py::list& refs, const py::list& copies) {
             auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(op.c_str(), overload.c_str());
             auto stack = stack_from(handle.schema(), args, kwargs);
             std::vector<CompiledReplay::ArgRef> rs;
             for (auto r : refs) {
               auto t = r.cast<py::tuple>();
               rs.push_back({t[0].cast<int64_t>(), t[1].cast<int64_t>(), ref_from(t[2])});
             }
             std::vector<CompiledReplay::CopyRef> cs;
             for (auto c : copies) {
               auto t = c.cast<py::tuple>();
               cs.push_back({t[0].cast<int64_t>(), t[1].cast<int64_t>(), ref_from(t[2])});
             }
             self.add_op(std::move(name), handle, std::move(stack), std::move(rs), std::move(cs));
           })
      .def("add_python",
           [](CompiledReplay& self, std::string name, py::object fn) {
             self.add_python(std::move(name), PyCallable(std::move(fn)));
           })
      .def("set_results",
           [](CompiledReplay& self, const py::list& results) {
             std::vector<ReplayRef> rs;
             for (auto r : results) rs.push_back(ref_from(r));
             self.set_results(std::move(rs));
           })
      .def("launch", &CompiledReplay::launch, py::arg("inputs"), py::arg("cpu_inputs"),
           py::call_guard<py::gil_scoped_release>())
      .def("__len__", &CompiledReplay::num_steps);
}

} // namespace torchneuron
