"""NKI data types and the conversions between them.

Storage uses NumPy dtypes; the 8-bit and 16-bit brain/ML float formats come
from the ``ml_dtypes`` package, whose casts round to nearest, ties to even, like
the hardware.  ``tfloat32`` has no NumPy dtype: it is stored as float32 whose
mantissa is rounded to 10 bits on every write.

Engines compute in float32 whatever the storage type (``to_compute``), and
results are rounded once when written to their destination (``from_compute``).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np


class _TFloat32:
    """Marker for tfloat32 (1 sign, 8 exponent, 10 mantissa bits) stored in float32."""

    name = "tfloat32"
    itemsize = 4

    def __repr__(self):
        return "tfloat32"

    def __reduce__(self):
        return "tfloat32"


tfloat32 = _TFloat32()

PACKED_TAG = "nki_packed"  # dtype metadata key naming the MX x4 type of a host array's integers


class Packed:
    """A 4-packed MX element type (NeuronCore-v4): four 8-bit or 4-bit floats in one 32- or 16-bit element.

    Stored as its unsigned integer of the same width; element ``j`` of a
    pack is byte ``j`` (fp8) or nibble ``j`` (fp4), lowest first.  Only DMA
    (bit copies), ``quantize_mx`` and ``nc_matmul_mx`` handle them.
    """

    __slots__ = ("name", "element", "bits", "storage", "host")

    def __init__(self, name, element, bits):
        self.name, self.element, self.bits = name, np.dtype(element), bits
        self.storage = np.dtype(np.uint32 if bits == 8 else np.uint16)
        # the storage integer tagged with this type: arrays made with it (``np.zeros(shape, dtype=t)``)
        # keep the tag, so a kernel given one sees an HBM tensor of this type
        self.host = np.dtype(self.storage, metadata={PACKED_TAG: name})

    @property
    def itemsize(self):
        return self.storage.itemsize

    @property
    def dtype(self):
        """The NumPy dtype of host arrays of this type (its storage integer, tagged with the type):
        NumPy takes any object with a ``dtype`` as a dtype, so ``np.zeros(shape, nl.float8_e4m3fn_x4)``
        works."""
        return self.host

    def unpack(self, raw: np.ndarray) -> np.ndarray:
        """float32 values, shape ``raw.shape + (4,)``."""
        raw = np.ascontiguousarray(raw, dtype=self.storage)
        if self.bits == 8:
            return raw.view(np.uint8).reshape(raw.shape + (4,)).view(self.element).astype(np.float32)
        nib = np.stack([(raw >> (4 * j)) & 0xF for j in range(4)], axis=-1).astype(np.uint8)
        return nib.view(self.element).astype(np.float32)

    def pack(self, values: np.ndarray) -> np.ndarray:
        """Round float32 values of shape ``(..., 4)`` to the element type and pack them."""
        q = np.ascontiguousarray(values, dtype=np.float32).astype(self.element)
        if self.bits == 8:
            return q.view(np.uint8).reshape(q.shape[:-1] + (4,)).view(self.storage).reshape(q.shape[:-1])
        b = q.view(np.uint8).astype(np.uint16) & 0xF
        return (b[..., 0] | (b[..., 1] << 4) | (b[..., 2] << 8) | (b[..., 3] << 12)).astype(np.uint16)

    def __repr__(self):
        return self.name

    def __reduce__(self):
        return self.name


class PackedArray(np.ndarray):
    """A host array of an MX x4 type: its storage integers, with the type (``.packed``) kept, so that
    host code can tell the values apart from plain integers (``host_dtypes.static_cast`` unpacks
    them, a kernel sees an HBM tensor of that type, a kernel's output of that type comes back as
    one).  Views and slices keep the type; arithmetic gives plain arrays."""

    def __new__(cls, storage_array, packed):
        obj = np.asarray(storage_array, dtype=packed.storage).view(cls)
        obj.packed = packed
        return obj

    def __array_finalize__(self, obj):
        self.packed = getattr(obj, "packed", None)

    def __array_wrap__(self, out, context=None, return_scalar=False):
        # results of arithmetic are numbers, not packs
        out = np.asarray(out)
        return out[()] if return_scalar else out


def packed_type_of(array):
    """The MX x4 type of a host array (a ``PackedArray`` or an array of a tagged dtype), or None."""
    if isinstance(array, PackedArray):
        return array.packed
    tag = (getattr(getattr(array, "dtype", None), "metadata", None) or {}).get(PACKED_TAG)
    return next((p for p in PACKED if p.name == tag), None) if tag else None


float8_e5m2_x4 = Packed("float8_e5m2_x4", ml_dtypes.float8_e5m2, 8)
float8_e4m3fn_x4 = Packed("float8_e4m3fn_x4", ml_dtypes.float8_e4m3fn, 8)
float4_e2m1fn_x4 = Packed("float4_e2m1fn_x4", ml_dtypes.float4_e2m1fn, 4)
PACKED = (float8_e5m2_x4, float8_e4m3fn_x4, float4_e2m1fn_x4)

bool_ = np.dtype(np.bool_)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
uint8 = np.dtype(np.uint8)
uint16 = np.dtype(np.uint16)
uint32 = np.dtype(np.uint32)
float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
# NKI's float8_e4m3 is the IEEE-style format (max 240, has inf/NaN); the "fn"
# variant (max 448, no inf) is the OCP one.  ml_dtypes has both.
float8_e4m3 = np.dtype(ml_dtypes.float8_e4m3)
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
# the MX scale type: an 8-bit power of two, 2**(bits - 127)
float8_e8m0fnu = np.dtype(ml_dtypes.float8_e8m0fnu)
fp32 = float32

_BY_NAME = {
    "bool": bool_, "bool_": bool_, "int8": int8, "int16": int16, "int32": int32,
    "uint8": uint8, "uint16": uint16, "uint32": uint32, "float16": float16,
    "fp16": float16, "float32": float32, "fp32": float32, "bfloat16": bfloat16,
    "bf16": bfloat16, "float8_e4m3": float8_e4m3, "float8_e4m3fn": float8_e4m3fn,
    "float8_e5m2": float8_e5m2, "tfloat32": tfloat32, "float8_e8m0fnu": float8_e8m0fnu,
    "float8_e5m2_x4": float8_e5m2_x4, "float8_e4m3fn_x4": float8_e4m3fn_x4, "float4_e2m1fn_x4": float4_e2m1fn_x4,
}

SUPPORTED = (bool_, int8, int16, int32, uint8, uint16, uint32, float16, float32,
             bfloat16, float8_e4m3, float8_e4m3fn, float8_e5m2, float8_e8m0fnu)


_NORMALIZED: dict = {}


def normalize(dtype):
    """Map anything a kernel may pass as ``dtype`` to an NKI dtype (np.dtype or tfloat32)."""
    try:
        return _NORMALIZED[dtype]  # every instruction asks; np.dtype's name lookup is slow
    except (KeyError, TypeError):
        pass
    if dtype is None or dtype is tfloat32 or isinstance(dtype, Packed):
        return dtype
    result = _normalize(dtype)
    try:
        _NORMALIZED[dtype] = result
    except TypeError:
        pass
    return result


def _normalize(dtype):
    if isinstance(dtype, str):
        try:
            return _BY_NAME[dtype]
        except KeyError:
            raise TypeError(f"unsupported NKI dtype {dtype!r}") from None
    if getattr(dtype, "name", None) == "tfloat32":
        return tfloat32
    d = np.dtype(dtype)
    if d == np.float64:
        # Host code often hands float64 arrays or Python floats; the device has
        # no 64-bit types, so they are narrowed at the HBM boundary only.
        return d
    if d == np.int64:
        return d
    if d not in SUPPORTED:
        raise TypeError(f"unsupported NKI dtype {d}")
    return d


def storage(dtype) -> np.dtype:
    """NumPy dtype used to hold values of an NKI dtype."""
    if dtype is tfloat32:
        return float32
    if isinstance(dtype, Packed):
        return dtype.storage
    return np.dtype(dtype)


def itemsize(dtype) -> int:
    return 4 if dtype is tfloat32 else storage(dtype).itemsize


def name(dtype) -> str:
    if dtype is tfloat32 or isinstance(dtype, Packed):
        return dtype.name
    return np.dtype(dtype).name


def is_float(dtype) -> bool:
    if isinstance(dtype, Packed):
        return False
    return dtype is tfloat32 or np.issubdtype(storage(dtype), np.floating) or storage(dtype) in (
        bfloat16, float8_e4m3, float8_e4m3fn, float8_e5m2, float8_e8m0fnu)


def is_int(dtype) -> bool:
    return dtype is not tfloat32 and not isinstance(dtype, Packed) and np.issubdtype(np.dtype(dtype), np.integer)


def _round_tf32(x: np.ndarray) -> np.ndarray:
    """Round float32 values to 10 mantissa bits, nearest-even (the tfloat32 grid)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    finite = (bits & 0x7F800000) != 0x7F800000
    lsb = (bits >> 13) & 1
    rounded = ((bits + 0x0FFF + lsb) & np.uint32(0xFFFFE000)).astype(np.uint32)
    return np.where(finite, rounded, bits).view(np.float32)


def to_compute(values: np.ndarray) -> np.ndarray:
    """Values as the engines see them: float32 (bool/int are converted exactly where possible)."""
    if values.dtype == np.float32:
        return values
    return values.astype(np.float32)


def from_compute(values, dtype) -> np.ndarray:
    """Round float32 engine results to ``dtype`` as the hardware does.

    Floats round to nearest-even (overflow goes to inf where the format has it,
    else saturates, as ml_dtypes does).  Integers round to nearest-even and
    saturate to the type's range instead of wrapping, and NaN becomes 0: an
    engine writing to an integer tile never produces a wrapped value.
    """
    values = np.asarray(values)
    if dtype is tfloat32:
        return _round_tf32(values.astype(np.float32, copy=False))
    if isinstance(dtype, Packed):
        if values.dtype == dtype.storage:
            return values  # bits moved by DMA
        raise TypeError(f"engines cannot write {dtype.name} values; quantize_mx produces them")
    d = np.dtype(dtype)
    if values.dtype == d:
        return values
    if d == np.bool_:
        return values != 0
    if np.issubdtype(d, np.integer):
        if np.issubdtype(values.dtype, np.integer) or values.dtype == np.bool_:
            info = np.iinfo(d)
            return np.clip(values, info.min, info.max).astype(d)
        info = np.iinfo(d)
        v = np.rint(values.astype(np.float64, copy=False))
        v = np.nan_to_num(v, nan=0.0, posinf=info.max, neginf=info.min)
        return np.clip(v, info.min, info.max).astype(d)
    if values.dtype == np.float64 and d != np.float32:
        # Go through float32 first: the engine result is float32, and double
        # rounding via float64 would not match it.
        values = values.astype(np.float32)
    if d == bfloat16 and values.dtype == np.float32 and values.flags.c_contiguous and ROUND_TO_BF16:
        out = np.empty(values.shape, bfloat16)
        ROUND_TO_BF16(values, out)  # the same bits as the cast below, faster
        return out
    return values.astype(d)


def _round_to_bf16():
    try:
        from .._C import _nki_round_to_bf16
    except ImportError:  # the emulator without the extension: NumPy's cast
        return None
    return _nki_round_to_bf16


# round(src, dst): float32 to bfloat16 bits into dst (C-contiguous, or 2-D
# with contiguous rows), or None without the extension
ROUND_TO_BF16 = _round_to_bf16()


def promote(a, b):
    """Result dtype of a binary tile operation when none is given.

    Same types keep their type; a float wins over an int; two different floats
    compute to float32 (the engines' internal type).
    """
    if a is None:
        return b
    if b is None or a == b:
        return a
    fa, fb = is_float(a), is_float(b)
    if fa and not fb:
        return a
    if fb and not fa:
        return b
    if fa and fb:
        return float32
    # two integer types: the wider one, signed if either is signed
    return np.promote_types(storage(a), storage(b)) if itemsize(a) != itemsize(b) else int32


def static_cast(array, dtype):
    """Host-side cast of a NumPy array to an NKI dtype with device rounding rules."""
    dtype = normalize(dtype)
    arr = np.asarray(array)
    if arr.dtype == np.float64 and is_float(dtype):
        arr = arr.astype(np.float32)
    return from_compute(arr, dtype)
