"""NKI dtypes on host arrays: the ``neuron_dtypes`` interface (AWS's host-side dtype package).

Code that prepares a kernel's inputs and checks its outputs on the host (the
NKI Library's tests among it) imports ``neuron_dtypes`` for casts with the
device's rounding, type facts and the MX x4 types.  This module answers that
name from this emulator's dtypes (``dtypes.py``); ``python -m
torchneuron.nki.library`` enters it as ``neuron_dtypes`` when no such package
is installed.

A packed MX x4 array on the host is a ``PackedArray``: its storage integers
(``uint32`` for fp8 x4, ``uint16`` for fp4 x4), four values per element, the
last axis a quarter of the unpacked one, with its type kept; casting it to
another type unpacks it.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from . import dtypes as _dt
from .dtypes import (  # noqa: F401  (the names the interface exports)
    bfloat16, float4_e2m1fn_x4, float8_e4m3, float8_e4m3fn, float8_e4m3fn_x4, float8_e5m2, float8_e5m2_x4,
    float8_e8m0fnu, float16, float32, int8, int16, int32, tfloat32, uint8, uint16, uint32)


def static_cast(array, dtype):
    """``array`` cast to ``dtype`` with the device's rounding (nearest even; integers saturate).

    Casting to an MX x4 type packs each four consecutive values of the last
    axis (which must be a multiple of 4) into one element."""
    normalized = _dt.normalize(dtype)
    source = _dt.packed_type_of(array)
    if source is not None:  # unpack: the last axis grows four times
        values = source.unpack(np.asarray(array).view(np.ndarray))
        values = values.reshape(values.shape[:-2] + (values.shape[-2] * 4,))
        return values if normalized is source else static_cast(values, dtype)
    if isinstance(normalized, _dt.Packed):
        values = np.asarray(array, dtype=np.float32)
        if values.ndim == 0 or values.shape[-1] % 4:
            raise ValueError(f"static_cast to {normalized.name}: the last axis ({values.shape}) must be a "
                             f"multiple of 4, the values one element packs")
        packed = normalized.pack(values.reshape(values.shape[:-1] + (values.shape[-1] // 4, 4)))
        return _dt.PackedArray(packed, normalized)
    return _dt.static_cast(array, dtype)


def sizeinbytes(dtype) -> int:
    """Bytes per element of ``dtype`` (a packed MX x4 element counts its four values)."""
    return _dt.itemsize(dtype)


def is_float_type(dtype) -> bool:
    """Is ``dtype`` a floating-point type (the 8-bit floats and packed MX types included)?"""
    normalized = _dt.normalize(dtype)
    return isinstance(normalized, _dt.Packed) or _dt.is_float(normalized)


def finfo(dtype):
    """Machine limits of a floating-point ``dtype`` (``ml_dtypes.finfo``; a packed type gives its element's)."""
    normalized = _dt.normalize(dtype)
    if isinstance(normalized, _dt.Packed):
        return ml_dtypes.finfo(normalized.element)
    if not is_float_type(normalized):
        raise TypeError(f"finfo: {_dt.name(normalized)} is not a floating-point type")
    return ml_dtypes.finfo(_dt.storage(normalized))
