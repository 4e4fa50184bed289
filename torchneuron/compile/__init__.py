"""``torch.compile(model, backend="neuron")``: see docs/compile.md.

Importing this package registers, once:

* the Dynamo backend ``"neuron"`` (so ``backend="neuron"`` and
  ``torch.compiler.set_default_backend("neuron")`` work),
* the ``neuron`` device interface with Dynamo,
* the ``neuron`` device with Inductor (C++ kernels, a wrapper that queues them
  as device tasks on the current stream), on the first compilation.
"""
from __future__ import annotations

import torch

_registered = False


def _register_dynamo() -> None:
    import torchneuron  # noqa: F401  (the device itself)

    from . import device_interface

    device_interface.register()


def register() -> None:
    """Registers the device with Dynamo and Inductor (idempotent). The backend
    calls it before its first compilation, so Inductor is imported only then."""
    global _registered
    if _registered:
        return
    from . import inductor_device

    _register_dynamo()
    inductor_device.register()
    _registered = True


def _register_backend() -> None:
    from .backend import neuron_backend

    try:
        torch._dynamo.register_backend(compiler_fn=neuron_backend, name="neuron")
    except AssertionError as e:  # "duplicate name": registered by an earlier import of this package
        if "duplicate" not in str(e):
            raise


_register_dynamo()
_register_backend()

from . import replay  # noqa: E402  (mode="reduce-overhead"; imports no Inductor)
from .backend import MODES, NeuronCompileError, neuron_backend  # noqa: E402

__all__ = ["register", "neuron_backend", "NeuronCompileError", "MODES", "replay"]
