"""Generated C++ kernels as device tasks on the current stream.

The wrapper code Inductor generates for a ``neuron`` graph calls
``neuron_launch(kernel, "name", *args)`` where the CPU wrapper would call
``kernel(*args)``. :func:`launch` hands the call to
``torchneuron_compile::launch`` (csrc/bridge/compile_launch.cpp), which queues
ONE task on the current stream of the tensors' device and returns at once. The
executor thread later calls ``torchneuron_compile::run``, whose CPU kernel
(:func:`_run_task`, here) takes the GIL and calls the kernel. Its arguments
are the same ``neuron`` tensors the host passed: their ``data_ptr()`` points
at host-addressable device memory, which the C++ kernel reads and writes.

So a compiled graph is ordered with eager work like any operator: kernels run
after what was queued before them on the stream, extern kernels (``mm``,
convolutions, ...) and buffer allocations go through the ordinary device
executor and allocator, and the host runs ahead.
"""
from __future__ import annotations

import itertools
import threading

import torch

_NAMESPACE = "torchneuron_compile"
_pending: dict = {}          # call id -> (kernel, args), consumed by the task
_ids = itertools.count(1)
_op = None
_lock = threading.Lock()


def _run_task(call, _host_aliases):
    entry = _pending.pop(call, None)
    if entry is None:
        raise RuntimeError(f"compiled kernel launch #{call} is unknown (already run?)")
    kernel, name, args = entry
    try:
        kernel(*args)
    except Exception as e:  # kept by the device, raised at the next sync
        raise RuntimeError(f"compiled kernel {name} failed: {type(e).__name__}: {e}") from e


def _launcher():
    global _op
    if _op is None:
        with _lock:
            if _op is None:
                import torchneuron  # noqa: F401  (loads _C, which defines the operators)

                ns = getattr(torch.ops, _NAMESPACE)
                try:
                    op = ns.launch.default
                except AttributeError:
                    raise RuntimeError(
                        "torchneuron._C has no compiled-kernel launcher (csrc/bridge/compile_launch.cpp): "
                        "rebuild with scripts/build.sh") from None
                lib = torch.library.Library(_NAMESPACE, "IMPL")
                lib.impl("run", _run_task, "CPU")
                _launcher.lib = lib  # keep the registration alive
                _op = op
    return _op


def launch(kernel, name: str, *args) -> None:
    """Queues ``kernel(*args)`` as one device task on the current stream."""
    op = _launcher()
    tensors = []
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.device.type == "neuron":
                tensors.append(a)
            elif a.device.type != "cpu" or a.dim() != 0:
                raise RuntimeError(f"compiled kernel {name}: argument on {a.device}, expected neuron tensors")
    if not tensors:  # nothing on the device to order with: run on the host, after the stream
        torch.neuron.synchronize()
        kernel(*args)
        return
    call = next(_ids)
    _pending[call] = (kernel, name, args)
    try:
        op(call, name, tensors)
    except BaseException:
        _pending.pop(call, None)
        raise
