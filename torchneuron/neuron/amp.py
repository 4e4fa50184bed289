"""``torch.neuron.amp``: ``torch.cuda.amp``'s names for the ``neuron`` device.

As in ``torch.cuda.amp``, each is a deprecated spelling of the device-generic
API and warns ``FutureWarning`` saying which: ``torch.autocast("neuron", ...)``,
``torch.amp.GradScaler("neuron", ...)``, ``torch.amp.custom_fwd/custom_bwd(...,
device_type="neuron")``. Libraries that take a device's ``amp`` module (as
accelerate does for other devices) find them here.
"""
from __future__ import annotations

import functools
import warnings

import torch

__all__ = ["autocast", "GradScaler", "custom_fwd", "custom_bwd"]


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"`torch.neuron.amp.{old}` is deprecated. Please use `{new}` instead.", FutureWarning, stacklevel=3)


class autocast(torch.amp.autocast_mode.autocast):
    """``torch.autocast("neuron", dtype=dtype, ...)``, with ``torch.cuda.amp.autocast``'s signature."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        _deprecated("autocast(args...)", "torch.amp.autocast('neuron', args...)")
        super().__init__("neuron", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("neuron", ...)``, with ``torch.cuda.amp.GradScaler``'s signature."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        _deprecated("GradScaler(args...)", "torch.amp.GradScaler('neuron', args...)")
        super().__init__("neuron", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)


def custom_fwd(fwd=None, *, cast_inputs=None):
    """``torch.amp.custom_fwd(fwd, device_type="neuron", cast_inputs=cast_inputs)``."""
    _deprecated("custom_fwd(args...)", "torch.amp.custom_fwd(args..., device_type='neuron')")
    return functools.partial(torch.amp.custom_fwd, device_type="neuron")(fwd=fwd, cast_inputs=cast_inputs)


def custom_bwd(bwd):
    """``torch.amp.custom_bwd(bwd, device_type="neuron")``."""
    _deprecated("custom_bwd(args...)", "torch.amp.custom_bwd(args..., device_type='neuron')")
    return functools.partial(torch.amp.custom_bwd, device_type="neuron")(bwd)
