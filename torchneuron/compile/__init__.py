"""``torch.compile`` on ``neuron``: see docs/compile.md.

Importing this package registers:

* the Dynamo backend ``"neuron"`` (so ``backend="neuron"`` and
  ``torch.compiler.set_default_backend("neuron")`` work),
* the ``neuron`` device interface with Dynamo.

The ``neuron`` device is registered with Inductor (C++ kernels, a wrapper that
queues them as device tasks on the current stream) by :func:`register`, when
Inductor first asks ``torch.neuron`` for its code generators (its first
compilation, whatever the backend) or when the ``neuron`` backend compiles.
So ``torch.compile(model)`` with Inductor, the default backend, runs on
``neuron`` tensors too, and ``import torch`` does not import Inductor.
"""
from __future__ import annotations

import sys
import warnings

import torch

_registered = False


def _register_dynamo() -> None:
    import torchneuron  # noqa: F401  (the device itself)

    from . import device_interface

    device_interface.register()


def register() -> None:
    """Registers the device with Dynamo and Inductor (idempotent)."""
    global _registered
    if _registered:
        return
    from . import inductor_device

    _register_dynamo()
    inductor_device.register()
    _registered = True


def inductor_codegen(name: str):
    """``torch.neuron.Scheduling`` / ``torch.neuron.PythonWrapperCodegen``:
    Inductor's hook for a PrivateUse1 device. Inductor's
    ``init_backend_registration`` reads them on its first call; answering
    registers ``neuron`` completely (:func:`register`), since Inductor itself
    registers a device from this hook only if it also has a C++ wrapper.
    Inductor ignores a RuntimeError raised here, so a failed patch check is
    also warned."""
    from .._torch_patches import TorchPatchError

    try:
        register()
    except TorchPatchError as e:
        warnings.warn(f"neuron is not registered with Inductor: {e}")
        raise
    from . import inductor_device

    return {"Scheduling": inductor_device.CppScheduling,
            "PythonWrapperCodegen": inductor_device.NeuronWrapperCodegen}[name]


def _register_backend() -> None:
    from .backend import neuron_backend

    try:
        torch._dynamo.register_backend(compiler_fn=neuron_backend, name="neuron")
    except AssertionError as e:  # "duplicate name": registered by an earlier import of this package
        if "duplicate" not in str(e):
            raise


_register_dynamo()
_register_backend()
if "torch._inductor.codegen.common" in sys.modules:
    register()  # Inductor is loaded already (no autoload): its hook may have run before this import

from . import replay  # noqa: E402  (mode="reduce-overhead"; imports no Inductor)
from .backend import MODES, NeuronCompileError, neuron_backend  # noqa: E402

__all__ = ["register", "neuron_backend", "NeuronCompileError", "MODES", "replay"]
