// torchneuron._C: the few entry points the Python layer needs beyond what
// PyTorch already routes through the guard, hooks and allocator.
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include "../allocator.h"
#include "../device_state.h"
#include "../exec/aten_meta.h"
#include "../exec/fusion_offer.h"
#include "../exec/meta.h"
#include "../exec/result_placement.h"
#include "../exec/thread_count.h"
#include "../generator.h"
#include "../host_allocator.h"
#include "../kernels/isa.h"
#include "../kernels/tanh.h"
#include "../kernels/vector_math.h"
#include "../ops/explicit_ops.h"
#include "../python_tasks/python_tasks.h"
#include "../sanitizers/op_tracking.h"
#include "../sanitizers/stream_sanitizer.h"
#include "bindings.h"

namespace py = pybind11;
using namespace torchneuron;

// From torch/csrc/profiler/python/combined_traceback.h, which the wheel
// ships without the nlohmann/json header it includes.
namespace torch {
TORCH_API std::vector<pybind11::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
TORCH_PYTHON_API void installCapturedTracebackPython();
} // namespace torch

namespace {

// torch.cuda.host_memory_stats_as_nested_dict()'s layout.
py::dict host_memory_stats() {
  const at::HostStats s = pinned_host_allocator().get_stats();
  auto stat = [](const c10::CachingAllocator::Stat& x) {
    py::dict d;
    d["current"] = x.current, d["peak"] = x.peak, d["allocated"] = x.allocated, d["freed"] = x.freed;
    return d;
  };
  auto duration = [](const c10::CachingAllocator::DurationStat& x) {
    py::dict d;
    d["total"] = x.total, d["max"] = x.max, d["min"] = x.min, d["count"] = x.count;
    d["avg"] = x.count ? x.total / x.count : 0;
    return d;
  };
  py::dict out;
  out["allocations"] = stat(s.allocations);
  out["allocated_bytes"] = stat(s.allocated_bytes);
  out["active_requests"] = stat(s.active_requests);
  out["active_bytes"] = stat(s.active_bytes);
  out["num_host_alloc"] = s.num_host_alloc;
  out["num_host_free"] = s.num_host_free;
  out["host_alloc_time"] = duration(s.host_alloc_time);
  out["host_free_time"] = duration(s.host_free_time);
  return out;
}

// The allocator history's stack traces: Python frames on Python's own
// threads (torch's gathering takes the GIL, which operator bindings have
// released; executor threads, which have no Python thread state, never wait
// for it), C++ frames too for stacks="all".
HistoryContext gather_stack(bool cpp) {
  const bool python = PyGILState_GetThisThreadState() != nullptr;
  if (!python && !cpp) return nullptr;
  return torch::CapturedTraceback::gather(python, python, cpp);
}
HistoryContext gather_python_stack() { return gather_stack(false); }
HistoryContext gather_python_and_cpp_stack() { return gather_stack(true); }

// Fills each dict's "frames" from its context, symbolizing all of them at once
// (frames repeat across events).
class FramesOfContexts {
 public:
  void add(py::dict d, const HistoryContext& context) {
    if (!context) {
      d["frames"] = py::list();
      return;
    }
    dicts_.push_back(std::move(d));
    tracebacks_.push_back(torch::getCapturedTracebackFromContext(context));
  }
  void fill() {
    auto frames = torch::py_symbolize(tracebacks_);
    for (size_t i = 0; i < dicts_.size(); ++i) dicts_[i]["frames"] = frames[i];
  }

 private:
  std::vector<py::dict> dicts_;
  std::vector<torch::CapturedTraceback*> tracebacks_;
};

py::dict memory_snapshot() {
  FramesOfContexts frames;
  py::list segments;
  for (const auto& s : device_allocator().snapshot()) {
    py::list blocks;
    size_t addr = s.address;
    for (const auto& b : s.blocks) {
      py::dict block;
      block["address"] = addr;
      block["size"] = b.size;
      block["requested_size"] = b.requested_size;
      block["state"] = b.allocated ? "active_allocated" : b.active ? "active_pending_free" : "inactive";
      frames.add(block, b.context);
      blocks.append(block);
      addr += b.size;
    }
    py::dict seg;
    seg["device"] = s.device;
    seg["address"] = s.address;
    seg["total_size"] = s.total_size;
    seg["allocated_size"] = s.allocated_size;
    seg["active_size"] = s.active_size;
    seg["requested_size"] = s.requested_size;
    seg["stream"] = s.stream;
    seg["segment_type"] = s.is_large ? "large" : "small";
    seg["segment_pool_id"] = py::make_tuple(0, 0);
    seg["is_expandable"] = false;
    seg["frames"] = py::list();
    seg["blocks"] = blocks;
    segments.append(seg);
  }
  py::list traces;
  for (int d = 0; d < device_count(); ++d) {
    py::list dev;
    for (const auto& t : device_allocator().trace(d)) {
      py::dict e;
      e["action"] = t.action;
      e["addr"] = t.address;
      e["size"] = t.size;
      e["stream"] = t.stream;
      e["time_us"] = t.time_us;
      frames.add(e, t.context);
      dev.append(e);
    }
    traces.append(dev);
  }
  frames.fill();
  py::dict out;
  out["segments"] = segments;
  out["device_traces"] = traces;
  return out;
}

} // namespace

// Over 80 lines because it is a list: one binding or a few lines each, in the
// module's order; bindings with helpers or state of their own live in the
// files bindings.h declares.
PYBIND11_MODULE(_C, m) {
  m.doc() = "torchneuron native bridge";
  ops::prefer_cpu_kernels();  // after the static registrations of the explicit kernels
  ops::prefer_nested_cpu_kernels();
  // GroupNorm's node subclasses PyTorch's: Python sees PyTorch's class
  // (its name and _saved_* attributes).
  torch::autograd::registerCppFunction(
      ops::group_norm_backward_node_type(),
      reinterpret_cast<PyTypeObject*>(py::module_::import("torch._C").attr("_functions").attr("NativeGroupNormBackward0").ptr()));
  m.def("_init", [] { ensure_initialized(); });
  m.def("device_count", [] { return int(device_count()); });
  m.def("_is_in_bad_fork", [] { return rt::in_bad_fork(); });
  m.def("_device_properties", [](int index) {
    check_device_index(index);
    const auto& p = rt::device(index).properties();
    return py::make_tuple(p.name, p.total_memory, p.core_id, p.cores_per_device, p.lnc);
  });
  // The runtime's reading of its settings (torchneuron/environment.py): raises
  // the configuration error, without initialising the devices.
  m.def("_runtime_config", [] {
    const rt::Config& c = rt::read_config();
    py::dict out;
    out["machine"] = c.machine.key;
    out["lnc"] = c.lnc;
    out["visible_cores"] = c.visible_cores;
    out["num_cores"] = c.num_cores;
    out["hbm_bytes"] = c.hbm_bytes;
    out["hbm_bytes_per_logical_core"] = c.machine.hbm_bytes_per_core * static_cast<size_t>(c.lnc);
    out["instance_logical_cores"] = rt::kInstanceCores / c.lnc;
    out["launch_blocking"] = c.launch_blocking;
    return out;
  });
  m.def("_utilization", [](int index) {
    check_device_index(index);
    return rt::device(index).busy_time().utilization(rt::now_ns());
  });
  // The runtime's reading of a TORCHNEURON_MACHINE value (tests: it agrees
  // with the NKI emulator's, torchneuron/nki/machine.py).
  m.def("_machine_model", [](const std::string& text) {
    try {
      const rt::Machine mm = rt::parse_machine(text);
      return py::make_tuple(mm.key, mm.core_name, mm.cores_per_device, mm.hbm_bytes_per_core);
    } catch (const rt::ConfigError& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("_launch_blocking", [] { return rt::config().launch_blocking; });
  // Whether the runtime reports tasks to a profiler (profiler/device_activities.h).
  m.def("_task_observer_set", [] { return device_count() > 0 && rt::device(0).observed(); });
  m.def("_synchronize", [](int index) {
    py::gil_scoped_release no_gil;
    check_device_index(index);
    translate_errors([&] { rt::device(index).synchronize(); });
    sanitizer::log(sanitizer::Kind::DeviceSynchronize, index, 0);
  });
  m.def("_default_generator", [](int index) {
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(default_generator(index)));
  });
  m.def("_memory_snapshot", &memory_snapshot);
  m.def("_host_memory_stats", &host_memory_stats);  // host_allocator.h
  m.def("_reset_accumulated_host_memory_stats", [] { pinned_host_allocator().reset_accumulated_stats(); });
  m.def("_reset_peak_host_memory_stats", [] { pinned_host_allocator().reset_peak_stats(); });
  // context: None, "state", "alloc" or "all"; stacks: "python" or "all" (torch.cuda's options, checked by the caller).
  m.def("_record_memory_history", [](bool enabled, std::optional<std::string> context, const std::string& stacks) {
    const HistoryFrames frames = !context                ? HistoryFrames::None
                               : *context == "state" ? HistoryFrames::State
                               : *context == "alloc" ? HistoryFrames::Alloc
                                                     : HistoryFrames::All;
    if (frames != HistoryFrames::None) torch::installCapturedTracebackPython();
    device_allocator().record_history(enabled, frames,
                                      stacks == "all" ? gather_python_and_cpp_stack : gather_python_stack);
  }, py::arg("enabled"), py::arg("context") = py::none(), py::arg("stacks") = "python");
  m.def("get_executed_ops", &executed_ops);
  m.def("get_fallback_ops", &fallback_ops);
  m.def("clear_op_tracking", &clear_op_tracking);
  m.def("get_fused_ops", &fused_ops);
  m.def("_fused_groups", &fused_groups);
  m.def("_meta_cache_entries", &meta_cache_entries);
  m.def("_aten_meta_operators", &aten_meta_operators);
  m.def("_elided_intermediates", &elided_intermediates);
  m.def("_set_adaptive_eager", &set_adaptive_eager);
  m.def("_set_min_fusable_numel", &set_min_fusable_numel);
  m.def("_set_host_thread_count", &set_host_thread_count);  // exec/thread_count.h
  m.def("_min_fusable_numel", &min_fusable_numel);
  m.def("_adaptive_eager_enabled", &adaptive_eager_enabled);
  // The instruction set the device's own loops run on (kernels/isa.h), and
  // the highest this host supports.
  m.def("_isa", [] {
    py::dict d;
    d["path"] = isa::kernels().name;
    d["host"] = isa::host_level();
    return d;
  });
  // Whether float32 tanh is the device's own function (TORCHNEURON_DEVICE_TANH=1,
  // kernels/tanh.h) rather than the CPU's; the import asks first, so a
  // malformed value fails it.
  m.def("_device_tanh", [] {
    try {
      return kernels::device_tanh_selected();
    } catch (const c10::ValueError& e) {
      throw py::value_error(e.what_without_backtrace());
    }
  });
  m.def("_fusion_computes_as_unfused", [](const std::string& op, at::ScalarType dtype) {
    return vector_math::as_unfused(op, dtype) != nullptr;
  });
  // Results computed in device memory (result_placement.h), for tests.
  m.def("_result_placement_counts", [] {
    auto [in_place, copied] = placement_counts();
    py::dict d;
    d["in_place"] = in_place;
    d["copied"] = copied;
    return d;
  });
  m.def("_placement_retention_error", &placement_retention_error);
  // Generated C++ kernels of torch.compile (torchneuron/compile/launch.py).
  m.def(
      "_launch_cpp_kernel",
      [](int64_t fn, const std::string& name, int device, std::vector<int64_t> ints, std::vector<float> floats,
         const std::vector<std::pair<int64_t, at::Tensor>>& scalars) {
        launch_cpp_kernel(fn, name, static_cast<c10::DeviceIndex>(device), {std::move(ints), std::move(floats)},
                          scalars);
      },
      py::arg("fn"), py::arg("name"), py::arg("device"), py::arg("ints"), py::arg("floats"), py::arg("scalars"));
  m.attr("_max_kernel_ints") = kMaxKernelInts;
  m.attr("_max_kernel_floats") = kMaxKernelFloats;
  // mode="reduce-overhead" replays (torchneuron/compile/replay.py).
  bind_compiled_replay(m);
  bind_device_errors(m);
  bind_distributed(m);
  bind_sharing(m);
  bind_sanitizer(m);
  bind_memcheck(m);
  bind_nki(m);
  bind_profiler(m);
}
