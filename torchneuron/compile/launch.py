"""Generated C++ kernels as device tasks on the current stream.

The wrapper code Inductor generates for a ``neuron`` graph calls
``neuron_launch(kernel, "name", *args)`` where the CPU wrapper would call
``kernel(*args)``. :func:`launch` queues the call as ONE task on the current
stream of the tensors' device and returns at once.

``kernel`` is Inductor's Python binding of a C++ function ``extern "C" void
kernel(...)`` in a shared object of its cache. When every argument is a
pointer or an int64 (tensors on ``neuron``, no host scalars: nearly every
kernel), the task calls that C entry point directly with the tensors' data
pointers (host-addressable device memory): no Python and no GIL on the
executor thread (``torchneuron._C._launch_cpp_kernel``, csrc/bridge/python_tasks.cpp).
Otherwise the task calls the Python binding with CPU aliases of the tensors
(torchneuron/_python_tasks.py), taking the GIL while the kernel runs.

Neither keeps references to the ``neuron`` tensors: buffers the wrapper frees
are reused in stream order, as in eager mode. So a compiled graph is ordered
with eager work like any operator, and the host runs ahead.
"""
from __future__ import annotations

import ctypes
import threading

import torch

from .. import _C
from .._python_tasks import launch as python_task

_entry_points: dict = {}   # Python binding -> address of its C entry point (or 0)
_local = threading.local()  # .recorder: a replay.Recorder while a graph is being recorded


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


def int_args(args) -> list[int] | None:
    """The kernel arguments as the C entry point takes them (tensors by data
    pointer), or None if one of them is not a pointer or an int64."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.device.type != "neuron":   # a host scalar: the binding's task keeps it alive
                return None
            out.append(a.data_ptr())
        elif type(a) is int or type(a) is bool:
            out.append(int(a))
        else:  # float scalars: the binding converts them
            return None
    return out


def recorder():
    return getattr(_local, "recorder", None)


def launch(kernel, name: str, *args) -> None:
    """Queues ``kernel(*args)`` as one device task on the current stream."""
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
    ints = int_args(args) if fn else None
    if ints is not None:
        _C._launch_cpp_kernel(fn, f"compiled::{name}", device, ints)
        return
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
