"""Registering ``neuron`` with Dynamo and Inductor (what compile/__init__.py's
docstring describes), apart from the package so that its modules (backend.py)
can call :func:`register` without importing their own package."""
from __future__ import annotations

import warnings

from .._torch_patches import TorchPatchError
from . import device_interface

_registered = False


def _inductor_device():
    """compile/inductor_device.py, on first use: it imports Inductor, which importing torchneuron does not."""
    from . import inductor_device

    return inductor_device


def register_dynamo() -> None:
    """Registers the ``neuron`` device interface with Dynamo."""
    device_interface.register()


def register() -> None:
    """Registers the device with Dynamo and Inductor (idempotent)."""
    global _registered
    if _registered:
        return
    register_dynamo()
    _inductor_device().register()
    _registered = True


def inductor_codegen(name: str):
    """``torch.neuron.Scheduling`` / ``torch.neuron.PythonWrapperCodegen``:
    Inductor's hook for a PrivateUse1 device. Inductor's
    ``init_backend_registration`` reads them on its first call; answering
    registers ``neuron`` completely (:func:`register`), since Inductor itself
    registers a device from this hook only if it also has a C++ wrapper.
    Inductor ignores a RuntimeError raised here, so a failed patch check is
    also warned."""
    try:
        register()
    except TorchPatchError as e:
        warnings.warn(f"neuron is not registered with Inductor: {e}")
        raise
    inductor_device = _inductor_device()
    return {"Scheduling": inductor_device.CppScheduling,
            "PythonWrapperCodegen": inductor_device.NeuronWrapperCodegen}[name]
