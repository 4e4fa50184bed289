"""Generated C++ kernels as device tasks on the current stream.

The wrapper code Inductor generates for a ``neuron`` graph calls
``neuron_launch(kernel, "name", *args)`` where the CPU wrapper would call
``kernel(*args)``. :func:`launch` queues the call as ONE task on the current
stream of the tensors' device (torchneuron/_python_tasks.py,
csrc/bridge/python_tasks.cpp) and returns at once; the executor thread later
takes the GIL and calls the kernel. Its arguments
are the same ``neuron`` tensors the host passed: their ``data_ptr()`` points
at host-addressable device memory, which the C++ kernel reads and writes.

So a compiled graph is ordered with eager work like any operator: kernels run
after what was queued before them on the stream, extern kernels (``mm``,
convolutions, ...) and buffer allocations go through the ordinary device
executor and allocator, and the host runs ahead.
"""
from __future__ import annotations

import torch

from .._python_tasks import launch as python_task


def launch(kernel, name: str, *args) -> None:
    """Queues ``kernel(*args)`` as one device task on the current stream."""
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
    # The task gets CPU aliases of the same device memory (the kernel only
    # takes their data pointers) and keeps no reference to the neuron tensors,
    # so buffers the wrapper frees are reused in stream order, as in eager mode.
    slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.device.type == "neuron"]
    template = [None if i in slots else a for i, a in enumerate(args)]

    def run(host):
        call = list(template)
        for i, h in zip(slots, host):
            call[i] = h
        kernel(*call)

    python_task(f"compiled::{name}", tensors, run)
