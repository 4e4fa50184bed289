"""The compile backend's TorchNeuron variables, read at each use (a test or a
program may set them between compilations)."""
from __future__ import annotations

import os

_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no")


def flag(name: str, default: bool) -> bool:
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(f"{name}={text!r} is invalid: expected 1, true, yes (on) or 0, false, no (off)")


def cpu_autocopy() -> bool:
    """CPU inputs of a compiled graph are copied to the device unless
    TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY is on."""
    return not flag("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", False)


def retain_device() -> bool:
    """TORCH_NEURONX_RETAIN_DEVICE_MODE: a graph whose inputs were all on the CPU
    returns its outputs on the CPU."""
    return flag("TORCH_NEURONX_RETAIN_DEVICE_MODE", False)


def fallback_execution() -> bool:
    """The default of options["fallback_execution"]: TorchNeuron raises on a failed
    compile unless TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION is 0."""
    return not flag("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", True)


def metrics_dir() -> str:
    return os.environ.get("TORCH_NEURONX_METRICS_DIR") or "/tmp"
