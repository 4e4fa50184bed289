"""``nki.benchmark`` and ``nki.profile``: a kernel's emulator time and its modelled latency on the chip.

``nki.benchmark(warmup=, iters=)(kernel)(*args)`` runs the kernel once
interpreted with its instructions recorded, models that launch on the chosen
machine (``perf_schedule.schedule``), then runs it ``warmup + iters`` more times on the
emulator (replaying its trace) and times them.  Afterwards
``kernel.benchmark_result`` has, in the shape of AWS's result:

* ``nc_latency.get_latency_percentile(p)``: the modelled device latency in
  microseconds (the model is deterministic: every percentile is the same);
* ``emulator_latency.get_latency_percentile(p)``: the emulator's wall time
  per call, in microseconds, over the timed iterations;
* ``model``: the ``perf_report.Report`` (``mfu``, ``mbu``, per-engine utilisation,
  ``timeline()``), also ``mfu`` and ``mbu`` directly.

Emulator iterations stop early once they have taken
``TORCHNEURON_NKI_BENCHMARK_SECONDS`` (default 10) of wall time, at least
one timed iteration being run; ``emulator_iterations`` says how many ran.
Inputs may be ``nki.typing.tensor[shape, dtype]`` specs (zero-filled
arrays).  ``save_neff_name``/``save_trace_name`` write files of those names:
the trace is the modelled instruction trace (JSON, Trace Event format), the
"NEFF" a JSON summary of the kernel's model, since the emulator compiles
nothing.  The call returns the kernel's outputs (computed, unlike on the
device, where they are undefined).

``nki.profile(working_directory=, save_neff_name=, save_trace_name=)``
writes the same files (and ``<kernel>_summary.json``) into the directory.
"""
from __future__ import annotations

import functools
import os
import time

import numpy as np

from . import perf
from .perf_report import Report, write_summary, write_trace
from .jit import Kernel
from .machine import resolve_machine

PERCENTILES = (0, 1, 10, 25, 50, 90, 99, 100)


def _budget_seconds() -> float:
    try:
        return float(os.environ.get("TORCHNEURON_NKI_BENCHMARK_SECONDS", "10"))
    except ValueError:
        return 10.0


class LatencyStats:
    """Latencies in microseconds, with ``get_latency_percentile(p)`` as AWS's result has."""

    def __init__(self, samples_us):
        self.samples = [float(s) for s in samples_us]

    def get_latency_percentile(self, p) -> float:
        if not self.samples:
            return float("nan")
        return float(np.percentile(self.samples, float(p)))

    @property
    def percentiles(self):
        return {p: self.get_latency_percentile(p) for p in PERCENTILES}

    def __repr__(self):
        return f"<latency p50={self.get_latency_percentile(50):.3f} us over {len(self.samples)} samples>"


class BenchmarkResult:
    def __init__(self, model: Report, emulator_us, first_call_s, warmup, iters):
        self.model = model
        self.nc_latency = LatencyStats([model.latency_us])
        self.emulator_latency = LatencyStats(emulator_us)
        self.emulator_iterations = len(emulator_us)
        self.first_call_seconds = first_call_s
        self.warmup, self.iters = warmup, iters

    @property
    def mfu(self):
        return self.model.mfu

    @property
    def mbu(self):
        return self.model.mbu

    def summary(self):
        emu = self.emulator_latency
        lines = [self.model.summary()]
        if emu.samples:
            lines.append(f"emulator: p50 {emu.get_latency_percentile(50) / 1e3:.3f} ms, "
                         f"p99 {emu.get_latency_percentile(99) / 1e3:.3f} ms over {len(emu.samples)} runs "
                         f"(first call {self.first_call_seconds:.3f} s)")
        return "\n".join(lines)

    def __repr__(self):
        return f"<nki benchmark result\n{self.summary()}>"


def _kernel_of(fn):
    if isinstance(fn, (Benchmarked, _Profiled)):
        return fn.kernel
    return fn if isinstance(fn, Kernel) else Kernel(fn)


class Benchmarked:
    """A kernel wrapped by ``nki.benchmark``; ``benchmark_result`` is set by each call."""

    def __init__(self, kernel, warmup=10, iters=100, save_neff_name=None, save_trace_name=None, quiet=False,
                 machine=None, **ignored):
        self.kernel = _kernel_of(kernel)
        functools.update_wrapper(self, self.kernel.fn)
        self.warmup, self.iters = int(warmup), int(iters)
        self.save_neff_name, self.save_trace_name = save_neff_name, save_trace_name
        self.quiet = quiet
        self.machine = machine
        self.benchmark_result = None

    def __getitem__(self, grid):
        b = Benchmarked.__new__(Benchmarked)
        b.__dict__.update(self.__dict__)
        b.kernel = self.kernel[grid]
        return b

    def __call__(self, *args, **kwargs):
        args, kwargs = perf.materialize(args, kwargs)
        target = resolve_machine(self.machine) if self.machine is not None else None
        result, records, machine, first = perf.run_profiled(self.kernel, args, kwargs, target=target)
        report = perf.model(records, machine, self.kernel.fn.__name__)
        kernel = self.kernel
        if target is not None:
            kernel = _with_target(kernel, target)
        samples = []
        budget = _budget_seconds()
        spent = 0.0
        for i in range(self.warmup + max(1, self.iters)):
            timed = i >= self.warmup
            if spent > budget:
                if not timed:
                    continue  # past the budget: skip the rest of the warm-up
                if samples:
                    break
            t0 = time.perf_counter()
            kernel(*args, **kwargs)
            dt = time.perf_counter() - t0
            spent += dt
            if timed:
                samples.append(dt * 1e6)
        self.benchmark_result = BenchmarkResult(report, samples, first, self.warmup, self.iters)
        _write_artifacts(report, os.getcwd(), self.save_neff_name, self.save_trace_name)
        if not self.quiet:
            print(f"nki.benchmark {self.kernel.fn.__name__}:\n{self.benchmark_result.summary()}", flush=True)
        return result


def _with_target(kernel, machine):
    k = kernel[kernel.grid] if kernel.grid else kernel[()]
    k.target = machine
    return k


def benchmark(kernel=None, **kwargs):
    """``nki.benchmark``: decorator (``@nki.benchmark(warmup=5, iters=10)``) or ``nki.benchmark(kernel, ...)``."""
    if kernel is None:
        return lambda k: Benchmarked(k, **kwargs)
    return Benchmarked(kernel, **kwargs)


class _Profiled:
    """A kernel wrapped by ``nki.profile``: each call writes the modelled trace."""

    def __init__(self, kernel, working_directory=None, save_neff_name="file.neff",
                 save_trace_name="profile.ntff", overwrite=False, profile_nth=1, machine=None, **ignored):
        self.kernel = _kernel_of(kernel)
        functools.update_wrapper(self, self.kernel.fn)
        self.working_directory = working_directory
        self.save_neff_name, self.save_trace_name = save_neff_name, save_trace_name
        self.overwrite = overwrite
        self.machine = machine
        self.report = None

    def __getitem__(self, grid):
        p = _Profiled.__new__(_Profiled)
        p.__dict__.update(self.__dict__)
        p.kernel = self.kernel[grid]
        return p

    def __call__(self, *args, **kwargs):
        args, kwargs = perf.materialize(args, kwargs)
        target = resolve_machine(self.machine) if self.machine is not None else None
        result, records, machine, seconds = perf.run_profiled(self.kernel, args, kwargs, target=target)
        self.report = perf.model(records, machine, self.kernel.fn.__name__)
        directory = self.working_directory or os.getcwd()
        os.makedirs(directory, exist_ok=True)
        _write_artifacts(self.report, directory, self.save_neff_name, self.save_trace_name,
                         overwrite=self.overwrite, summary=True, emulator_seconds=seconds)
        return result


def profile(func=None, working_directory=None, **kwargs):
    """``nki.profile(working_directory=..., save_neff_name=, save_trace_name=, overwrite=, profile_nth=)``.

    Writes the kernel's modelled instruction trace (``save_trace_name``,
    default ``profile.ntff``: JSON in the Trace Event format, with the
    instruction list), a JSON summary in place of the NEFF
    (``save_neff_name``, default ``file.neff``) and ``<kernel>_summary.json``
    into ``working_directory`` (an absolute path, as upstream requires)."""
    if working_directory is None or not os.path.isabs(str(working_directory)):
        raise ValueError("nki.profile: working_directory must be given as an absolute path")

    def wrap(k):
        return _Profiled(k, working_directory=str(working_directory), **kwargs)
    return wrap if func is None else wrap(func)


def _write_artifacts(report, directory, neff_name, trace_name, overwrite=True, summary=False, **extra):
    def path(name):
        p = name if os.path.isabs(name) else os.path.join(directory, name)
        if not overwrite and os.path.exists(p):
            raise FileExistsError(f"{p} exists (pass overwrite=True)")
        return p
    if trace_name:
        write_trace(report, path(trace_name))
    if neff_name:
        write_summary(report, path(neff_name), note="emulator model summary; the emulator compiles no NEFF",
                           **extra)
    if summary:
        write_summary(report, path(f"{report.kernel_name}_summary.json"), **extra)


def baremetal(kernel=None, **options):
    """``nki.baremetal``: run a kernel on NumPy arrays (compile options and NEFF/NTFF names are accepted).

    ``save_trace_name`` writes the kernel's modelled instruction trace there,
    as ``nki.profile`` does."""
    trace_name = options.pop("save_trace_name", None)
    neff_name = options.pop("save_neff_name", None)
    for k in ("additional_compile_opt", "artifacts_dir"):
        options.pop(k, None)

    def wrap(fn):
        k = fn if isinstance(fn, Kernel) else Kernel(fn, **options)
        if trace_name is None and neff_name is None:
            return k
        return _Profiled(k, working_directory=os.getcwd(), save_neff_name=neff_name,
                         save_trace_name=trace_name)
    return wrap if kernel is None else wrap(kernel)
