"""Generated C++ kernels as device tasks on the current stream.

The wrapper code Inductor generates for a ``neuron`` graph calls
``neuron_launch(kernel, "name", *args)`` where the CPU wrapper would call
``kernel(*args)``. :func:`launch` queues the call as ONE task on the current
stream of the tensors' device and returns at once.

``kernel`` is Inductor's Python binding of a C++ function ``extern "C" void
kernel(...)`` in a shared object of its cache. Its arguments are pointers
(tensors on ``neuron``; 0-dim CPU tensors, host scalars such as the Python
floats Dynamo passes as tensors), ``int64_t`` and ``float``. The task calls
that C entry point directly (``torchneuron._C._launch_cpp_kernel``,
csrc/bridge/python_tasks/python_tasks.cpp) with the tensors' data pointers
(host-addressable device memory) and a pointer to a copy of each host
scalar's value taken here: no Python and no GIL on the executor thread. Only
a kernel the C call path cannot take (more than 8 float or 1024 other
arguments, or no entry point found) is run by a Python task calling the binding with CPU
aliases of the tensors (torchneuron/_python_tasks.py), taking the GIL while
the kernel runs; ``stats`` counts both.

Neither keeps references to the ``neuron`` tensors: buffers the wrapper frees
are reused in stream order, as in eager mode. So a compiled graph is ordered
with eager work like any operator, and the host runs ahead.
"""
from __future__ import annotations

import collections
import ctypes
import threading

import torch

from .. import _C
from .._python_tasks import launch as python_task

_entry_points: dict = {}   # Python binding -> address of its C entry point (or 0)
_local = threading.local()  # .recorder: a replay.DeviceWorkRecorder while a graph is being recorded
#: kernel tasks queued: "entry_point" (called from C++, no GIL), "binding"
#: (a Python task calling the kernel's binding, with the GIL)
stats: collections.Counter = collections.Counter()
#: called as observer(kernel, name, args) before each launch while the stream
#: sanitizer runs (torchneuron/sanitizers/stream.py), else None
observer = None


def entry_point(kernel) -> int:
    """Address of ``kernel``'s C entry point, or 0 if it is not an Inductor
    C++ binding (the module Inductor loads from ``<hash>.so`` exports it)."""
    addr = _entry_points.get(kernel)
    if addr is None:
        addr = 0
        path = getattr(getattr(kernel, "__self__", None), "__file__", None)
        if getattr(kernel, "__name__", None) == "kernel" and path and path.endswith(".so"):
            lib = ctypes.CDLL(path)  # already loaded by Inductor: dlopen returns the same handle
            addr = ctypes.cast(getattr(lib, "kernel"), ctypes.c_void_p).value or 0
        _entry_points[kernel] = addr
    return addr


#: the most pointer/integer and float arguments the C call path takes
#: (csrc/bridge/python_tasks/python_tasks.cpp: every float must fit in a register)
MAX_INT_ARGS, MAX_FLOAT_ARGS = _C._max_kernel_ints, _C._max_kernel_floats


class CArgs:
    """A kernel's arguments as its C entry point takes them, split by the
    register class the calling convention gives them: ``ints`` (pointers and
    int64 in order; tensors by data pointer, host scalars as 0 for now),
    ``floats`` (in order), ``scalars`` = [(index in ints, 0-dim CPU tensor)]
    passed by pointer to a copy of the value. ``pos[i]``: argument i's index
    in ``ints`` (None for a float)."""
    __slots__ = ("ints", "floats", "scalars", "pos")

    def __init__(self):
        self.ints, self.floats, self.scalars, self.pos = [], [], [], []


def c_args(args) -> CArgs | None:
    """The kernel arguments for its C entry point, or None if one of them
    cannot go that way (the binding's parser takes only pointers, int64 and
    float, so a Python float is a ``float`` parameter)."""
    out = CArgs()
    for a in args:
        if isinstance(a, torch.Tensor):
            out.pos.append(len(out.ints))
            if a.device.type == "neuron":
                out.ints.append(a.data_ptr())
            elif a.device.type == "cpu" and a.dim() == 0:
                out.scalars.append((len(out.ints), a))
                out.ints.append(0)
            else:
                return None
        elif type(a) is int or type(a) is bool:
            out.pos.append(len(out.ints))
            out.ints.append(int(a))
        elif type(a) is float:
            out.pos.append(None)
            out.floats.append(a)
        else:
            return None
    return out if len(out.ints) <= MAX_INT_ARGS and len(out.floats) <= MAX_FLOAT_ARGS else None


def recorder():
    return getattr(_local, "recorder", None)


def launch(kernel, name: str, *args) -> None:
    """Queues ``kernel(*args)`` as one device task on the current stream."""
    if observer is not None:
        observer(kernel, name, args)
    rec = recorder()
    if rec is not None:
        rec.on_kernel(kernel, name, args)
    device = None
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.device.type == "neuron":
                if device is None:
                    device = a.device.index
            elif a.device.type != "cpu" or a.dim() != 0:
                raise RuntimeError(f"compiled kernel {name}: argument on {a.device}, expected neuron tensors")
    if device is None:  # nothing on the device to order with: run on the host, after the stream
        torch.neuron.synchronize()
        kernel(*args)
        return
    fn = entry_point(kernel)
    c = c_args(args) if fn else None
    if c is not None:
        stats["entry_point"] += 1
        _C._launch_cpp_kernel(fn, f"compiled::{name}", device, c.ints, c.floats, c.scalars)
        return
    stats["binding"] += 1
    # The Python binding, on CPU aliases of the same device memory (the
    # kernel only takes their data pointers); 0-dim CPU tensors are kept alive
    # by the template until the task ran.
    slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.device.type == "neuron"]
    template = [None if i in slots else a for i, a in enumerate(args)]

    def run(host):
        call = list(template)
        for i, h in zip(slots, host):
            call[i] = h
        kernel(*call)

    python_task(f"compiled::{name}", [args[i] for i in slots], run)
