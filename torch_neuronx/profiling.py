"""``torch_neuronx.profiling``: TorchNeuron's profiling interface on this device.

A TorchNeuron program profiles with stock ``torch.profiler.profile``, a
:class:`NeuronConfig` as its ``experimental_config`` and
``NeuronProfiler(config).export_trace`` as its ``on_trace_ready``::

    cfg = NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], profile_output_dir="./profile_output")
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                experimental_config=cfg, on_trace_ready=NeuronProfiler(cfg).export_trace):
        ...
        torch_neuronx.synchronize()

Each trace-ready call writes one directory,
``<profile_output_dir>/<host>_pid_<pid>/<timestamp>/``, holding the framework
trace ``trace.json`` (host operators and the device's tasks on one timeline)
and, for ``CPU_UTIL`` and ``HOST_MEMORY``, the host samples. What each mode
produces here, and what the real runtime writes that this device cannot
(NEFF, NTFF and the runtime's protobuf traces), is in docs/explorer.md
("Profiling as TorchNeuron documents it"). ``python -m torchneuron.explorer``
opens such a directory.

:class:`NeuronConfig` is a ``torch._C._profiler._ExperimentalConfig`` whose
``custom_profiler_config`` carries the settings to the device's profiler
(csrc/bridge/profiler), as TorchNeuron's does, so stock PyTorch takes it
unchanged.
"""
from __future__ import annotations

import enum
import json
import os
import re
import socket
import time

from torch._C._profiler import _ExperimentalConfig

__all__ = ["ProfileMode", "NeuronConfig", "NeuronProfiler"]


class ProfileMode(enum.Enum):
    """What a profile collects besides the framework trace (docs/explorer.md)."""

    DEVICE = "device"            # the real device: instruction-level traces (.neff + .ntff)
    RUNTIME = "runtime"          # the real runtime: its system trace (ntrace.pb, trace_info.pb)
    CPU_UTIL = "cpu_util"        # host CPU utilisation
    HOST_MEMORY = "host_memory"  # host memory use


_CORES = re.compile(r"^\s*\d+\s*(-\s*\d+\s*)?(,\s*\d+\s*(-\s*\d+\s*)?)*$")
_DEFAULT_MODES = (ProfileMode.DEVICE, ProfileMode.RUNTIME)


def _check_cores(value):
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"NeuronConfig: capture_enabled_for_nc must be a string of NeuronCore indices or ranges "
                        f"such as '0,1,2-5', or None; got {type(value).__name__} {value!r}")
    if not _CORES.match(value):
        raise ValueError(f"NeuronConfig: capture_enabled_for_nc={value!r} is not a comma-separated list of "
                         f"NeuronCore indices or ranges such as '0,1,2-5'")
    items = []
    for item in value.replace(" ", "").split(","):
        first, _, last = item.partition("-")
        if last and int(first) > int(last):
            raise ValueError(f"NeuronConfig: capture_enabled_for_nc={value!r}: the range {item!r} runs backwards")
        items.append(item)
    return ",".join(items)


def _check_dir(name, value, *, optional):
    if value is None and optional:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"NeuronConfig: {name} must be a path (str or os.PathLike)"
                        f"{' or None' if optional else ''}; got {type(value).__name__} {value!r}")
    path = os.fspath(value)
    if isinstance(path, bytes):
        raise TypeError(f"NeuronConfig: {name} must be a text path, not bytes: {value!r}")
    if not path:
        raise ValueError(f"NeuronConfig: {name} is empty")
    if ";" in path:
        # ';' separates the items of the profiler's config string.
        raise ValueError(f"NeuronConfig: {name}={path!r} contains ';', which the profiler's config cannot carry")
    return path


class NeuronConfig(_ExperimentalConfig):
    """The Neuron part of a ``torch.profiler.profile`` run, passed as its
    ``experimental_config``.

    * ``modes``: list of :class:`ProfileMode` (default ``[DEVICE, RUNTIME]``).
    * ``max_events_per_nc``: at most this many device tasks per NeuronCore in the
      trace; the oldest are left out, with a warning naming how many.
    * ``capture_enabled_for_nc``: NeuronCores (device indices of this process)
      whose tasks are captured, as ``"0,1,2-5"``; None: all.
    * ``profile_output_dir``: where :meth:`NeuronProfiler.export_trace` writes.
    * ``neff_cache_dir``, ``precache_node_info``: accepted and kept; this device
      has no NEFFs and no per-NEFF metadata to precache.
    """

    def __init__(self, modes=None, max_events_per_nc=1_000_000, capture_enabled_for_nc=None,
                 profile_output_dir="./output", neff_cache_dir=None, precache_node_info=True):
        if modes is None:
            modes = list(_DEFAULT_MODES)
        if isinstance(modes, (str, bytes, ProfileMode)) or not hasattr(modes, "__iter__"):
            raise TypeError(f"NeuronConfig: modes must be a list of ProfileMode values; got {modes!r}")
        checked = []
        for mode in modes:
            if not isinstance(mode, ProfileMode):
                raise TypeError(f"NeuronConfig: modes holds {mode!r}, which is not a ProfileMode "
                                f"(one of {', '.join('ProfileMode.' + m.name for m in ProfileMode)})")
            if mode not in checked:
                checked.append(mode)
        if isinstance(max_events_per_nc, bool) or not isinstance(max_events_per_nc, int):
            raise TypeError(f"NeuronConfig: max_events_per_nc must be an int; got "
                            f"{type(max_events_per_nc).__name__} {max_events_per_nc!r}")
        if max_events_per_nc <= 0:
            raise ValueError(f"NeuronConfig: max_events_per_nc must be positive; got {max_events_per_nc}")
        if not isinstance(precache_node_info, bool):
            raise TypeError(f"NeuronConfig: precache_node_info must be a bool; got "
                            f"{type(precache_node_info).__name__} {precache_node_info!r}")
        cores = _check_cores(capture_enabled_for_nc)
        output = _check_dir("profile_output_dir", profile_output_dir, optional=False)
        neff = _check_dir("neff_cache_dir", neff_cache_dir, optional=True)

        items = [f"profile_output_dir:{output}", f"max_events_per_nc:{max_events_per_nc}"]
        if cores is not None:
            items.append(f"capture_enabled_for_nc:{cores}")
        items += [f"cpu_util:{str(ProfileMode.CPU_UTIL in checked).lower()}",
                  f"host_memory:{str(ProfileMode.HOST_MEMORY in checked).lower()}",
                  f"modes:{','.join(m.value for m in checked)}"]
        super().__init__(custom_profiler_config=";".join(items))
        self._settings = dict(modes=tuple(checked), max_events_per_nc=max_events_per_nc,
                              capture_enabled_for_nc=cores, profile_output_dir=output, neff_cache_dir=neff,
                              precache_node_info=precache_node_info)

    # Read-only: the config string above is what the profiler reads.
    modes = property(lambda self: list(self._settings["modes"]))
    max_events_per_nc = property(lambda self: self._settings["max_events_per_nc"])
    capture_enabled_for_nc = property(lambda self: self._settings["capture_enabled_for_nc"])
    profile_output_dir = property(lambda self: self._settings["profile_output_dir"])
    neff_cache_dir = property(lambda self: self._settings["neff_cache_dir"])
    precache_node_info = property(lambda self: self._settings["precache_node_info"])

    def _kwargs(self):
        return dict(self._settings, modes=list(self._settings["modes"]))

    def __reduce__(self):
        # torch.profiler copies the config (copy.copy) in some cases: a copy is a NeuronConfig too.
        return (_rebuild, (self._kwargs(), self.trace_only))

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self._kwargs().items())
        return f"NeuronConfig({args})"


def _rebuild(kwargs, trace_only):
    config = NeuronConfig(**kwargs)
    config.trace_only = trace_only
    return config


def _rank() -> int:
    """torch.distributed's rank when a process group is up, else $RANK, else 0."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    value = os.environ.get("RANK")
    if value is not None:
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"NeuronProfiler: the environment variable RANK={value!r} is not an integer") from None
    return 0


# What the real device and runtime write that this one cannot, per mode.
_NOT_PRODUCED = {
    ProfileMode.DEVICE: ".neff and .ntff files (instruction-level traces of the NeuronCore hardware): this "
                        "device compiles no NEFFs and has no hardware trace; its tasks are in trace.json",
    ProfileMode.RUNTIME: "ntrace.pb and trace_info.pb (the Neuron runtime's system trace, a protobuf format of "
                         "the runtime): the emulated runtime's tasks and launches are in trace.json",
}


class NeuronProfiler:
    """Writes a profile where TorchNeuron's tools look for it:
    ``on_trace_ready=NeuronProfiler(config).export_trace``."""

    def __init__(self, config: NeuronConfig | None = None):
        if config is None:
            config = NeuronConfig()
        if not isinstance(config, NeuronConfig):
            raise TypeError(f"NeuronProfiler: config must be a torch_neuronx.profiling.NeuronConfig; "
                            f"got {type(config).__name__}")
        self.config = config

    def _session_dir(self) -> str:
        root = os.path.abspath(self.config.profile_output_dir)
        # The real runtime names the process directory by the EC2 instance id; a host name plays that part here.
        process_dir = os.path.join(root, f"{socket.gethostname()}_pid_{os.getpid()}")
        now = time.time()
        stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(now)) + f"_{int(now % 1 * 1e6):06d}"
        path, n = os.path.join(process_dir, stamp), 0
        while True:
            try:
                os.makedirs(path)
                return path
            except FileExistsError:
                n += 1
                path = os.path.join(process_dir, f"{stamp}_{n}")

    def _session_report(self, prof):
        """What the device's profiler kept and sampled for `prof`, or None when its
        session did not run with this config (no PrivateUse1 activity, or another
        experimental_config)."""
        import torchneuron
        from torch.profiler import ProfilerActivity

        used = getattr(prof, "experimental_config", None)
        if used is None or getattr(used, "custom_profiler_config", None) != self.config.custom_profiler_config:
            return None
        if ProfilerActivity.PrivateUse1 not in getattr(prof, "activities", ()):
            return None
        return torchneuron._C._profiler_last_session()

    def export_trace(self, prof) -> str:
        """Writes the trace of `prof` (a ``torch.profiler.profile``) and the files
        of the config's modes into a new directory; returns that directory."""
        if not hasattr(prof, "export_chrome_trace"):
            raise TypeError(f"NeuronProfiler.export_trace: expected a torch.profiler.profile, "
                            f"got {type(prof).__name__}")
        rank = _rank()
        directory = self._session_dir()
        trace_path = os.path.join(directory, "trace.json")
        prof.export_chrome_trace(trace_path)
        with open(trace_path, encoding="utf-8") as f:
            trace = json.load(f)

        modes = self.config.modes
        report = self._session_report(prof)
        samples = report["samples"] if report else []
        base_ns = int(trace.get("baseTimeNanoseconds", 0))
        files = ["trace.json"]
        if ProfileMode.CPU_UTIL in modes and any("cpu_busy" in s for s in samples):
            _write_json(os.path.join(directory, "cpu_util.json"), _cpu_util(samples))
            files.append("cpu_util.json")
            trace["traceEvents"] += _cpu_counters(samples, base_ns)
        if ProfileMode.HOST_MEMORY in modes and any("mem_total" in s for s in samples):
            _write_json(os.path.join(directory, "host_mem.json"), _host_mem(samples))
            files.append("host_mem.json")
            trace["traceEvents"] += _memory_counters(samples, base_ns)

        info = {
            "rank": rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "modes": [m.name for m in modes],
            "capture_enabled_for_nc": self.config.capture_enabled_for_nc,
            "max_events_per_nc": self.config.max_events_per_nc,
            "files": files,
            "not_produced": {m.name: _NOT_PRODUCED[m] for m in modes if m in _NOT_PRODUCED},
        }
        if report is None:
            info["device_activity"] = ("not recorded by this config: pass ProfilerActivity.PrivateUse1 and "
                                       "experimental_config=<this NeuronConfig> to torch.profiler.profile")
        else:
            info["device_tasks_per_nc"] = {str(k): v for k, v in report["kept"].items()}
            info["dropped_tasks_per_nc"] = {str(k): v for k, v in report["dropped"].items()}
            info["tasks_of_other_ncs"] = report["other_cores"]
        for mode, name in ((ProfileMode.CPU_UTIL, "cpu_util.json"), (ProfileMode.HOST_MEMORY, "host_mem.json")):
            if mode in modes and name not in files:
                info["not_produced"][mode.name] = (
                    f"{name}: no host samples: the device's profiler samples only in a session with "
                    "ProfilerActivity.PrivateUse1 and this NeuronConfig" if report is None else
                    f"{name}: the capture was too short for a sample (the kernel counts CPU time in clock "
                    "ticks; a CPU utilisation sample needs two ticks per CPU)")
        trace["neuronProfile"] = info
        trace.setdefault("distributedInfo", {"rank": rank})
        _write_json(trace_path, trace)
        return directory


def _write_json(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _cpu_util(samples):
    rows = [{"time_ns": s["time_ns"], "host_busy": s["cpu_busy"], "per_cpu_busy": s["cpu_busy_per_cpu"],
             "process_cpus": s["process_cpus"]} for s in samples if "cpu_busy" in s]
    return {"description": "host CPU utilisation over each sampling period (shares 0 to 1); process_cpus: this "
                           "process's CPU time over the period's wall time (1 = one CPU busy)",
            "cpus": len(rows[0]["per_cpu_busy"]) if rows else 0, "samples": rows}


def _host_mem(samples):
    rows = [{"time_ns": s["time_ns"], "total_bytes": s["mem_total"], "available_bytes": s["mem_available"],
             "used_bytes": s["mem_total"] - s["mem_available"], "process_rss_bytes": s["process_rss"]}
            for s in samples if "mem_total" in s]
    return {"description": "host memory (bytes): used = total - available (/proc/meminfo); the process's "
                           "resident set", "samples": rows}


def _counter(name, t_ns, base_ns, args):
    return {"ph": "C", "name": name, "cat": "neuron_host", "pid": os.getpid(), "tid": 0,
            "ts": (t_ns - base_ns) / 1e3, "args": args}


def _cpu_counters(samples, base_ns):
    out = []
    for s in samples:
        if "cpu_busy" not in s:
            continue
        per_cpu = {f"cpu{i}": round(100 * b, 2) for i, b in enumerate(s["cpu_busy_per_cpu"])}
        out.append(_counter("host CPU utilisation (%)", s["time_ns"], base_ns,
                            {"all": round(100 * s["cpu_busy"], 2), **per_cpu}))
        out.append(_counter("process CPU (%)", s["time_ns"], base_ns, {"process": round(100 * s["process_cpus"], 2)}))
    return out


def _memory_counters(samples, base_ns):
    return [_counter("host memory (bytes)", s["time_ns"], base_ns,
                     {"used": s["mem_total"] - s["mem_available"], "process RSS": s["process_rss"]})
            for s in samples if "mem_total" in s]
