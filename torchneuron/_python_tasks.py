"""Python callables as device tasks on the current stream (see
csrc/bridge/python_tasks/python_tasks.cpp). Used by NKI kernels and compiled kernels."""
from __future__ import annotations

import itertools
import threading
from typing import Callable, Sequence

import torch

_pending: dict[int, tuple[str, Callable]] = {}   # call id -> (task name, callable), consumed by the task
_ids = itertools.count(1)
_lock = threading.Lock()
_lib = None


def _run(call: int, host_tensors: Sequence[torch.Tensor]) -> None:
    name, fn = _pending.pop(call, (None, None))
    if fn is None:
        raise RuntimeError(f"device task #{call} is unknown (already run?)")
    try:
        fn(host_tensors)
    except Exception as e:  # kept by the device, raised at the next synchronisation
        raise RuntimeError(f"{name} failed: {type(e).__name__}: {e}") from e


def _launcher():
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                lib = torch.library.Library("torchneuron", "IMPL")
                lib.impl("run_python_task", _run, "CPU")
                _lib = lib
    return torch.ops.torchneuron.launch_python_task.default


def launch(name: str, tensors: Sequence[torch.Tensor], fn: Callable[[Sequence[torch.Tensor]], None]) -> None:
    """Queues ``fn(host_aliases_of_tensors)`` as one task named ``name`` on the
    current stream of the tensors' (neuron) device, and returns at once."""
    op = _launcher()
    call = next(_ids)
    _pending[call] = (name, fn)
    try:
        with torch.no_grad():
            op(call, name, list(tensors))
    except BaseException:
        _pending.pop(call, None)
        raise
