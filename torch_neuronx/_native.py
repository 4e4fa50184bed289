"""The native TorchNeuron API as AWS's ``torch_neuronx`` names it, answered by this device.

AWS's documentation has TorchNeuron programs call device, stream, memory and
op-tracking functions on ``torch_neuronx`` itself (``torch_neuronx.synchronize()``,
``with torch_neuronx.stream(s):``, ``torch_neuronx.get_fallback_ops()``). Most
are ``torch.neuron``'s functions under the same names; where TorchNeuron's
differ in what they return or raise, these follow TorchNeuron's.
"""
from __future__ import annotations

import torch

import torchneuron

# torch.neuron's own, as TorchNeuron's module re-exports its device module's.
from torch.neuron import (  # noqa: F401
    Event,
    Stream,
    StreamContext,
    current_device,
    current_stream,
    default_stream,
    device,
    device_count,
    empty_cache,
    get_device_properties,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
    set_stream,
    stream,
    synchronize,
)
from torchneuron import clear_op_tracking, nki_op  # noqa: F401
from torchneuron.compile.metrics import get_dynamo_metrics, reset_dynamo_metrics  # noqa: F401

from . import neuron_dynamo_backend  # noqa: F401

__all__ = ["synchronize", "device_count", "current_device", "set_device", "get_device_properties",
           "is_neuron_runtime_initialized", "device", "Stream", "Event", "StreamContext", "stream",
           "current_stream", "default_stream", "set_stream", "memory_stats", "memory_allocated",
           "max_memory_allocated", "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats",
           "reset_accumulated_memory_stats", "memory_summary", "empty_cache", "get_fallback_ops",
           "get_executed_ops", "clear_op_tracking", "nki_op", "wrap_nki", "get_dynamo_metrics",
           "reset_dynamo_metrics", "neuron_dynamo_backend"]


def set_device(device: int | str | torch.device) -> None:
    """Makes `device` current; an index outside ``range(device_count())`` is a ``ValueError``, as
    TorchNeuron raises (``torch.neuron.set_device`` raises CUDA's ``IndexError``)."""
    index = torch.device(device).index if isinstance(device, (str, torch.device)) else device
    if index is not None and not (isinstance(index, int) and 0 <= index < device_count()):
        raise ValueError(f"Invalid device id: {index} (this process sees {device_count()} neuron devices)")
    torch.neuron.set_device(device)


def is_neuron_runtime_initialized() -> bool:
    """Whether the device runtime is up (``torch.neuron.is_initialized()``)."""
    return torch.neuron.is_initialized()


def _calls(counts: dict) -> list[str]:
    return [name for name, n in sorted(counts.items()) for _ in range(n)]


def get_fallback_ops() -> list[str]:
    """The operators that ran by the synchronous fallback since the last ``clear_op_tracking()``,
    a name per call, as TorchNeuron's list is (``torchneuron.get_fallback_ops()`` counts them by
    name). The calls are listed by name, not in the order they ran."""
    return _calls(torchneuron.get_fallback_ops())


def get_executed_ops() -> list[str]:
    """The operators that ran on the device since the last ``clear_op_tracking()``, a name per
    call, grouped by name."""
    return _calls(torchneuron.get_executed_ops())


class _NkiCaller:
    """What ``wrap_nki`` returns: ``caller[grid](*args)`` or ``caller(*args)`` launches the kernel."""

    def __init__(self, kernel, grid=()):
        self.kernel, self.grid = kernel, grid

    def __getitem__(self, grid):
        return _NkiCaller(self.kernel, grid if isinstance(grid, tuple) else (grid,))

    def __call__(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            # one node of the graph (Kernel.__call__ itself is not traced: it would graph-break)
            from torchneuron.nki import compiled_calls

            return compiled_calls.call(self.kernel.number, self.grid or self.kernel.grid, args, kwargs)
        k = self.kernel[self.grid] if self.grid else self.kernel
        return k(*args, **kwargs)

    def __repr__(self):
        return f"wrap_nki({self.kernel!r}){list(self.grid) if self.grid else ''}"


def wrap_nki(kernel, **options):
    """An ``@nki.jit`` kernel made callable from PyTorch code, its grid given as ``caller[grid]``
    (vLLM's Neuron plugin calls kernels this way). Keyword options of TorchNeuron's are accepted
    and have no effect here.

    In eager code each call is one device task on the current stream (a direct kernel call).
    Inside ``torch.compile`` (``backend="neuron"`` or any other, with or without fullgraph) the
    call is one node of the graph, launched in the graph's order; the inputs the kernel writes
    into (found by running it once at compile time, or annotated ``nt.mutable_tensor``) are
    declared as in-place updates (docs/nki.md, "wrap_nki calls inside torch.compile").

    There is no autograd, as with TorchNeuron's: eager calls record no history, and a compiled
    graph that records gradients through a call is refused with an error naming the kernel. Use
    ``nki_op`` with ``register_autograd`` to train through a kernel."""
    from torchneuron.nki.jit import Kernel

    if not isinstance(kernel, Kernel):
        raise TypeError(f"wrap_nki takes an @nki.jit kernel, not {type(kernel).__name__}")
    return _NkiCaller(kernel)
