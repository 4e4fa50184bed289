// What the last profiling session on `neuron` kept and sampled
// (profiler/device_activities.h), for torch_neuronx.profiling's export.
#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include "../profiler/device_activities.h"
#include "bindings.h"

namespace py = pybind11;

namespace torchneuron {

void bind_profiler(py::module_& m) {
  // None before any session with device activities was processed.
  m.def("_profiler_last_session", []() -> py::object {
    const profiler::SessionReport r = profiler::last_session_report();
    if (!r.valid) return py::none();
    py::list samples;
    for (const profiler::HostSample& s : r.samples) {
      py::dict d;
      d["time_ns"] = s.time_ns;
      if (r.cpu_util && s.has_cpu) {
        d["cpu_busy"] = s.cpu_busy;
        d["cpu_busy_per_cpu"] = s.cpu_busy_per_cpu;
        d["process_cpus"] = s.process_cpus;
      }
      if (r.host_memory) {
        d["mem_total"] = s.mem_total;
        d["mem_available"] = s.mem_available;
        d["process_rss"] = s.process_rss;
      }
      samples.append(std::move(d));
    }
    py::dict out;
    out["kept"] = r.kept;
    out["dropped"] = r.dropped;
    out["other_cores"] = r.other_cores;
    out["cpu_util"] = r.cpu_util;
    out["host_memory"] = r.host_memory;
    out["samples"] = samples;
    out["problems"] = r.problems;
    return out;
  });
}

} // namespace torchneuron
