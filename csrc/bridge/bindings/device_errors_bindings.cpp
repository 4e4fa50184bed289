// The device's error slot and the host's waits, as Python sees them: sticky
// errors read and reset, waits that Ctrl-C interrupts, and the bounded drain
// at interpreter exit (torchneuron/_registration.py).
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include "../device_state.h"
#include "bindings.h"

namespace py = pybind11;

namespace torchneuron {
namespace {

pthread_t g_main_thread;  // Python runs signal handlers on its main thread only

// Runtime wait-interrupt check (runtime/stream.h): on Python's main thread,
// runs the pending signal handlers; a handler's exception (KeyboardInterrupt
// from Ctrl-C, a test runner's timeout) abandons the wait and reaches Python
// through the dispatcher and PyTorch's bindings, which restore it. Off the
// main thread, or while the interpreter finalises, waits are not interrupted.
void check_python_signals() {
  if (!pthread_equal(pthread_self(), g_main_thread) || !Py_IsInitialized() || _Py_IsFinalizing()) return;
  if (PyGILState_Check()) {
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    return;
  }
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

// {"errors": kept messages, "total", "unreported", "unreported_errors": the
// kept messages no synchronising call has raised}, without C++ backtraces.
py::dict as_dict(const rt::Device::Errors& errors) {
  py::list all, unreported;
  const size_t first_unreported = errors.total - errors.unreported;
  for (size_t k = 0; k < errors.kept.size(); ++k) {
    std::string what = errors.kept[k].what();
    py::str message(what.substr(0, what.find("\nException raised from ")));
    all.append(message);
    if (k >= first_unreported) unreported.append(message);
  }
  py::dict d;
  d["errors"] = all;
  d["total"] = errors.total;
  d["unreported"] = errors.unreported;
  d["unreported_errors"] = unreported;
  return d;
}

// What the exit drain found, applied to the exit status once the interpreter
// has finalised (exit() runs on_exit handlers with the status the program
// chose: sys.exit(3), an uncaught exception's 1, or 0).
enum ExitOutcome : int { kClean = 0, kUnreportedErrors = 1, kInterrupted = 2 };
std::atomic<int> g_exit_outcome{kClean};

void apply_exit_outcome(int status, void*) {
  const int outcome = g_exit_outcome.load();
  if (outcome == kClean) return;
  std::fflush(nullptr);
  if (outcome == kInterrupted) {
    // As Python ends a program a KeyboardInterrupt ended: killed by SIGINT
    // (a shell shows 130), whatever status it was exiting with.
    ::signal(SIGINT, SIG_DFL);
    sigset_t only_sigint;
    sigemptyset(&only_sigint);
    sigaddset(&only_sigint, SIGINT);
    pthread_sigmask(SIG_UNBLOCK, &only_sigint, nullptr);
    ::raise(SIGINT);
    ::_exit(128 + SIGINT);
  }
  if (status == 0) ::_exit(1);  // unreported device errors: a failure, unless the program chose its own status
}

} // namespace

void bind_device_errors(py::module_& m) {
  g_main_thread = pthread_self();  // the extension is imported on the main thread
  rt::set_wait_interrupt_check(&check_python_signals);
  m.def("_device_errors", [](int index) {
    check_device_index(index);
    return as_dict(rt::device(index).errors());
  });
  m.def("_reset_errors", [](int index) {
    check_device_index(index);
    return as_dict(rt::device(index).take_errors());
  });
  // Waits up to `timeout_s` for every stream of the device; whether it is idle.
  m.def("_wait_idle", [](int index, double timeout_s) {
    check_device_index(index);
    const int64_t deadline = rt::now_ns() + static_cast<int64_t>(timeout_s * 1e9);
    py::gil_scoped_release no_gil;
    return translate_errors([&] { return rt::device(index).wait_idle(deadline); });
  });
  // Cancels the device's work that has not started; how many tasks that was.
  m.def("_cancel_pending", [](int index) {
    check_device_index(index);
    return rt::device(index).cancel_pending();
  });
  // The exit drain's findings (torchneuron/_registration.py), applied at exit():
  // "unreported_errors" turns status 0 into 1, "interrupted" ends the process
  // by SIGINT.
  ::on_exit(&apply_exit_outcome, nullptr);
  m.def("_set_exit_outcome", [](const std::string& outcome) {
    const int value = outcome == "unreported_errors" ? kUnreportedErrors : outcome == "interrupted" ? kInterrupted : -1;
    TORCH_CHECK_VALUE(value >= 0, "unknown exit outcome '", outcome, "'");
    int seen = g_exit_outcome.load();
    while (seen < value && !g_exit_outcome.compare_exchange_weak(seen, value)) {
    }
  });
}

} // namespace torchneuron
