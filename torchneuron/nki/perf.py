"""The performance model: modelled latency of a kernel on the chosen machine, engine by engine.

While a kernel is interpreted with a ``Recorder`` attached, every outermost
instruction becomes a record: its name, kernel line, and the tensors it reads
and writes (memory, dtype, shape, bytes, the region of its buffer, the
contiguous run the DMA would move).  ``schedule(records, machine)`` charges
each instruction to an engine (Tensor, Vector, Scalar, GpSimd, or the DMA
queues) with a cost from the published figures of the machine
(``machine.MACHINES``), and runs the engines concurrently: every engine
executes its own instructions in program order, and an instruction starts
when its engine is free and the instructions it depends on (overlapping
reads and writes of the same buffer region) have finished.

The model's latency is the time the last instruction finishes.  MFU is the
matmul work at the peak rate of its input type over that latency; MBU the
bytes moved to or from HBM over the latency at the DMA bandwidth.  This is a
model from public figures, not a cycle-accurate simulator; what it gets
right is the relative cost of kernels (memory- against compute-bound,
engine balance, overlap).

The stages, a file each: the records (recorder.py, the instruction recorder the
trace cache shares), their costs (perf_costs.py), the schedule on the engines
(perf_schedule.py), the report and its trace files (perf_report.py); this module
runs a kernel through them.
"""
from __future__ import annotations

import time

import numpy as np

from .jit import Kernel, jit, run_on_host_buffers
from .machine import default_target, resolve_machine
from .perf_report import Report
from .perf_schedule import schedule
from .recorder import Recorder
from .typing import TensorSpec


def run_profiled(kernel, args, kwargs, *, target=None, hbm_allocator=None):
    """Interpret one launch of ``kernel`` (an ``nki.jit`` Kernel) recording its instructions.

    Returns (result, records, machine, seconds).  The trace cache is not used, so the
    kernel's Python runs and every instruction is seen."""
    if not isinstance(kernel, Kernel):
        kernel = jit(kernel)
    rec = Recorder()
    machine = target or kernel.target
    t0 = time.perf_counter()
    result = run_on_host_buffers(kernel.fn, kernel.grid, args, kwargs, target=machine, debug=kernel.debug,
                                 kernel_name=kernel.fn.__name__, cache=None, profile=rec,
                                 hbm_allocator=hbm_allocator)
    seconds = time.perf_counter() - t0
    records = Records(rec.records)
    records.lives = rec.lives
    records.kernel_file = getattr(getattr(kernel.fn, "__code__", None), "co_filename", None)
    return result, records, machine or default_target(), seconds


class Records(list):
    """A launch's instruction records, with its instances' liveness counts and the kernel's file."""

    lives = ()
    kernel_file = None


def model(records, machine, kernel_name="") -> Report:
    """``schedule`` with the occupancy and source file a ``run_profiled`` recording carries."""
    report = schedule(records, machine, kernel_name, getattr(records, "lives", None))
    report.kernel_file = getattr(records, "kernel_file", None)
    return report


def estimate(kernel, *args, machine=None, **kwargs) -> Report:
    """Run ``kernel`` once on ``args`` (NumPy arrays or ``nki.typing.tensor`` specs) and return the
    performance model's ``Report`` (latency, MFU, MBU, engine utilisation, ``timeline()``)."""
    m = resolve_machine(machine) if machine is not None else None
    args, kwargs = materialize(args, kwargs)
    _, records, used, _ = run_profiled(kernel, args, kwargs, target=m)
    return model(records, used, _kernel_name(kernel))


def timeline(kernel, *args, machine=None, **kwargs) -> list:
    """The modelled per-engine instruction timeline of one launch: a list of dicts
    (``engine``, ``start``, ``end`` in ns, ``name``, ``source`` as file:line, ...)."""
    return estimate(kernel, *args, machine=machine, **kwargs).timeline()


def _kernel_name(kernel):
    fn = getattr(kernel, "fn", kernel)
    return getattr(fn, "__name__", "kernel")


def materialize(args, kwargs):
    """Kernel arguments as arrays: ``nki.typing.tensor[shape, dtype]`` specs become zero-filled arrays,
    torch tensors host copies."""
    def conv(v):
        if isinstance(v, TensorSpec):
            return v.zeros()
        if type(v).__module__.split(".")[0] == "torch" and hasattr(v, "detach"):
            from .torch_bridge import host_view  # the torch side of NKI loads on first use (nki/__init__.py)
            return np.array(host_view(v.detach().cpu()))
        if isinstance(v, list) and any(isinstance(x, TensorSpec) for x in v):
            return [conv(x) for x in v]
        if isinstance(v, tuple) and any(isinstance(x, TensorSpec) for x in v):
            return tuple(conv(x) for x in v)
        return v
    return [conv(a) for a in args], {k: conv(v) for k, v in kwargs.items()}
