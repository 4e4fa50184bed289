// The pieces of torchneuron._C defined outside python_module.cpp.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace torchneuron {

// torchneuron._C._CompiledReplay (compiled_replay_bindings.cpp).
void bind_compiled_replay(pybind11::module_& m);
// Device errors, interruptible waits and the exit drain (device_errors_bindings.cpp).
void bind_device_errors(pybind11::module_& m);
// The `neuron` c10d backend (distributed_bindings.cpp).
void bind_distributed(pybind11::module_& m);
// Device storages shared between processes (sharing_bindings.cpp).
void bind_sharing(pybind11::module_& m);
// The stream sanitizer's log and helpers (sanitizer_bindings.cpp).
void bind_sanitizer(pybind11::module_& m);
// The device memory checker's reports (memcheck_bindings.cpp).
void bind_memcheck(pybind11::module_& m);
// The NKI emulator's host loops (nki_bindings.cpp).
void bind_nki(pybind11::module_& m);
// What the last profiling session kept and sampled (profiler_bindings.cpp).
void bind_profiler(pybind11::module_& m);

} // namespace torchneuron
