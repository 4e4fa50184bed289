"""``torch_neuronx``: AWS's import name for TorchNeuron, answered by this project.

Libraries find the Neuron device under this name: transformers'
``is_torch_neuron_available`` and accelerate's ``is_neuron_available`` first
look for a module ``torch_neuronx``, then ask ``torch.neuron``. This package
is shipped by the ``torchneuron`` distribution (not PyPI's unrelated
``torch-neuronx``); importing it imports :mod:`torchneuron`, which registers
the ``neuron`` device, so with it installed those libraries select ``neuron``
by themselves (docs/huggingface.md).

Its native API (``synchronize``, ``device_count``, ``Stream``, the memory
functions, op tracking as lists of names, ``nki_op``, ``wrap_nki``: see
:mod:`torch_neuronx._native`) answers as TorchNeuron's does. It also carries
the functions of AWS's earlier XLA-based ``torch_neuronx`` that have a
meaning on this device (:func:`trace`, :func:`replace_weights`,
:func:`analyze`, :class:`DataParallel`, :func:`dynamic_batch`,
:func:`lazy_load`, :func:`async_load`, :func:`move_trace_to_device`,
:mod:`torch_neuronx.experimental`). Those tied to the XLA lazy-tensor stack
(:mod:`torch_neuronx.xla_impl`) raise ``NotImplementedError`` naming what to
use instead.
"""
from importlib import metadata as _metadata

import torchneuron  # noqa: F401  (registers the device and torch.neuron)

try:
    __version__ = _metadata.version("torchneuron")
except _metadata.PackageNotFoundError:  # a checkout used from its path, not installed
    __version__ = "0+unknown"

from ._api import (  # noqa: E402
    DataParallel,
    analyze,
    async_load,
    dynamic_batch,
    lazy_load,
    move_trace_to_device,
    replace_weights,
    trace,
)
from . import experimental  # noqa: E402,F401
from . import profiling  # noqa: E402,F401
from .profiling import NeuronProfiler  # noqa: E402
from . import _native  # noqa: E402
from ._native import *  # noqa: E402,F401,F403

__all__ = [
    "__version__",
    "trace",
    "replace_weights",
    "analyze",
    "DataParallel",
    "dynamic_batch",
    "lazy_load",
    "async_load",
    "move_trace_to_device",
    "experimental",
    "profiling",
    "NeuronProfiler",
] + _native.__all__


def __getattr__(name: str):
    # xla_impl is imported on first use only: its attributes raise.
    if name == "xla_impl":
        import importlib

        return importlib.import_module(".xla_impl", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
