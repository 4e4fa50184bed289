"""Where a compiled graph's inputs live: TorchNeuron's CPU auto-copy.

TorchNeuron copies the CPU tensors among a ``backend="neuron"`` graph's inputs to
the device, so a model left on the CPU runs compiled on ``neuron`` (its outputs
are ``neuron`` tensors). The copies are made outside the compiled function, with
``Tensor.to``, so gradients flow back to the CPU tensors; an input the graph
mutates is written back into its CPU tensor after the call. 0-dim CPU tensors
(Python scalars Dynamo passes as tensors, optimizer step counters) are left where
they are: the device takes them as eager operators do.

``TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY=1`` turns the copy off: a CPU input
is then an error, as on TorchNeuron, unless ``options={"allow_cpu_inputs": True}``
asks for a graph whose CPU parts run on the host.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch


def cpu_inputs(example_inputs: Sequence) -> list[int]:
    """Indices of the inputs the auto-copy moves: CPU tensors with a dimension."""
    return [i for i, t in enumerate(example_inputs)
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dim() > 0]


def to_device(example_inputs: Sequence, indices: list[int], device: torch.device) -> list:
    """The example inputs with those at `indices` on `device`. Each copy takes its CPU
    tensor's entry in Dynamo's tracing context (its sizes' symbols and its source), so
    AOTAutograd gives it the same fake tensor shapes as the graph Dynamo traced."""
    context = torch._guards.TracingContext.try_get()
    moved = list(example_inputs)
    for i in indices:
        moved[i] = moved[i].to(device)
        if context is not None and example_inputs[i] in context.tensor_to_context:
            context.tensor_to_context[moved[i]] = context.tensor_to_context[example_inputs[i]]
    return moved


def copying(compiled: Callable, indices: list[int], device: torch.device, to_host: bool) -> Callable:
    """`compiled` (compiled for the inputs at `indices` on `device`) called on the CPU
    inputs: each is copied in, written back if the graph mutated it, and with `to_host`
    (TORCH_NEURONX_RETAIN_DEVICE_MODE, all inputs on the CPU) the outputs go to the CPU."""
    def run(*args):
        args = list(args)
        copies = []
        for i in indices:
            host = args[i]
            args[i] = host.to(device)
            copies.append((host, args[i], args[i]._version))
        out = compiled(*args)
        del args
        with torch.no_grad():
            for host, copy, version in copies:
                if copy._version != version:  # the graph wrote into its input
                    host.copy_(copy)
        if to_host:
            out = type(out)(o.cpu() if isinstance(o, torch.Tensor) else o for o in out) \
                if isinstance(out, (list, tuple)) else (out.cpu() if isinstance(out, torch.Tensor) else out)
        return out

    return run
