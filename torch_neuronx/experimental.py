"""``torch_neuronx.experimental``: AWS's NeuronCore placement functions.

AWS's traced models are NEFFs that can span several NeuronCores; here a traced
module is a ``ScriptModule`` whose weights live on one ``neuron`` device, so
placement is where those tensors are. What maps onto that works; spreading one
model over several cores raises ``NotImplementedError`` naming
:class:`torch_neuronx.DataParallel`, which replicates it instead.
"""
from __future__ import annotations

import torch

from ._api import _check_traced

_USE_DATA_PARALLEL = ("a module runs on one neuron device here; to use several, replicate it with "
                      "torch_neuronx.DataParallel(model, device_ids=[...])")


def set_neuron_cores(trace, start_nc: int = -1, nc_count: int = -1) -> None:
    """Moves a traced module to ``neuron:start_nc`` (the current device for -1), in place.
    ``nc_count`` other than -1 or 1 raises ``NotImplementedError``."""
    _check_traced(trace, "experimental.set_neuron_cores")
    if nc_count not in (-1, 1):
        raise NotImplementedError(f"set_neuron_cores(nc_count={nc_count}): {_USE_DATA_PARALLEL}")
    index = torch.neuron.current_device() if start_nc == -1 else start_nc
    trace.to(torch.device("neuron", index))


def set_multicore(trace) -> None:
    """Raises ``NotImplementedError``: one module does not span several devices here."""
    raise NotImplementedError(f"set_multicore: {_USE_DATA_PARALLEL}")


def neuron_cores_context(start_nc: int = -1, nc_count: int = -1):
    """Raises ``NotImplementedError``: ``torch.jit.load`` places a module by its
    ``map_location``, which this context cannot change."""
    raise NotImplementedError(
        "neuron_cores_context: load onto a device with torch.jit.load(path, map_location=f'neuron:{i}'), "
        "or trace there inside `with torch.neuron.device(i):`")


def multicore_context():
    """Raises ``NotImplementedError``: one module does not span several devices here."""
    raise NotImplementedError(f"multicore_context: {_USE_DATA_PARALLEL}")


__all__ = ["set_neuron_cores", "set_multicore", "neuron_cores_context", "multicore_context"]
