// torchneuron._C's part of the device memory checker (torchneuron/sanitizers/memcheck.py,
// ../sanitizers/memcheck.h): its reports with their stacks, and the pending call that
// hands them to Python's main thread.
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include <atomic>

#include "../sanitizers/memcheck.h"
#include "bindings.h"

namespace py = pybind11;

namespace torch {
TORCH_API std::vector<pybind11::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
TORCH_PYTHON_API void installCapturedTracebackPython();
} // namespace torch

namespace torchneuron {
namespace {

PyObject* g_on_reports = nullptr;  // torchneuron.memcheck._on_reports, kept for the process's life
std::atomic<bool> g_scheduled{false};

// Python frames of the calling thread, where it has a Python thread state.
HistoryContext gather_python() {
  if (PyGILState_GetThisThreadState() == nullptr) return nullptr;
  return torch::CapturedTraceback::gather(true, true, false);
}

// Runs on the main thread between bytecodes; an exception it sets is raised there.
int deliver(void*) {
  g_scheduled.store(false);
  runtime::memcheck::revoke_fault_grant();
  PyObject* r = PyObject_CallNoArgs(g_on_reports);
  if (!r) return -1;
  Py_DECREF(r);
  return 0;
}

// From any thread, the SIGSEGV handler included: schedules one delivery.
void notify() {
  if (!g_scheduled.exchange(true)) Py_AddPendingCall(deliver, nullptr);
}

} // namespace

void bind_memcheck(py::module_& m) {
  m.def("_memcheck_enabled", &runtime::memcheck::on);
  m.def("_memcheck_protecting", &runtime::memcheck::protecting);
  m.def("_memcheck_protection_off_reason", [] { return runtime::memcheck::protection_off_reason(); });
  // fn() with device access: the threads it starts inherit it (a thread's
  // protection key rights are its creator's), as gloo's, which run
  // collectives on host views of device memory, must
  m.def("_with_device_access", [](py::object fn) {
    runtime::memcheck::DeviceAccess access;
    return fn();
  });
  m.def("_memcheck_start", [](py::object on_reports) {
    g_on_reports = on_reports.release().ptr();
    torch::installCapturedTracebackPython();
    memcheck::set_gather(gather_python);
    memcheck::set_report_notifier(notify);
    memcheck::grant_parallel_workers();
  });
  // [{kind, message, python_stack, stacks: [(title, frames)]}]; frames as
  // torch.cuda.memory._snapshot's (dicts of filename, line, name).
  m.def("_memcheck_take_reports", [] {
    auto reports = memcheck::take_reports();
    std::vector<torch::CapturedTraceback*> tracebacks;
    for (auto& r : reports)
      for (auto& [title, ctx] : r.stacks)
        if (ctx) tracebacks.push_back(torch::getCapturedTracebackFromContext(ctx));
    auto frames = torch::py_symbolize(tracebacks);
    size_t k = 0;
    py::list out;
    for (auto& r : reports) {
      py::list stacks;
      for (auto& [title, ctx] : r.stacks) stacks.append(py::make_tuple(title, ctx ? frames[k++] : py::none()));
      py::dict d;
      d["kind"] = r.kind;
      d["message"] = r.message;
      d["python_stack"] = r.python_stack;
      d["stacks"] = stacks;
      out.append(d);
    }
    return out;
  });
  m.def("_memcheck_stats", [] {
    auto s = memcheck::stats();
    py::dict d;
    d["poisoned"] = s.poisoned, d["checked"] = s.checked, d["unchecked"] = s.unchecked;
    d["canary_checks"] = s.canary_checks, d["reports"] = s.reports;
    return d;
  });
}

} // namespace torchneuron
