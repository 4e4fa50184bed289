"""Engine arithmetic shared by nki.language and nki.isa.

Every instruction reads its operands as float32 (the engines' internal
type), computes with vectorised NumPy over the whole tile, and produces a
float32 result that is rounded once to the destination dtype.  Operators can
be given as nki.language functions or as NumPy ufuncs (``op=np.add``).
"""
from __future__ import annotations

import os

import numpy as np

from . import dtypes as _dt
from .errors import NKILimitError, NKITypeError
from .machine import Buffer, TileSize
from .tensor import NkiTensor, align_to, allocate, pair_shapes, register_arithmetic
from .instruction import instruction

F32 = np.float32


# --------------------------------------------------------------- functions
def _erf(x):
    # Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7, below float32 resolution
    # for the values that matter); NumPy has no vectorised erf.
    s = np.sign(x)
    a = np.abs(x).astype(np.float64)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t
               + 0.254829592) * t * np.exp(-a * a)
    return (s * y).astype(F32)


def _sigmoid(x):
    return (1.0 / (1.0 + np.exp(-x))).astype(F32)


UNARY = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda x: (1.0 / np.sqrt(x)).astype(F32),
    "reciprocal": lambda x: (1.0 / x).astype(F32),
    "tanh": np.tanh, "sigmoid": _sigmoid,
    "relu": lambda x: np.maximum(x, F32(0)),
    "gelu": lambda x: (0.5 * x * (1.0 + _erf(x / np.sqrt(F32(2))))).astype(F32),
    "gelu_apprx_tanh": lambda x: (0.5 * x * (1.0 + np.tanh(F32(0.7978845608) * (x + F32(0.044715) * x ** 3)))).astype(F32),
    "gelu_apprx_sigmoid": lambda x: (x * _sigmoid(F32(1.702) * x)).astype(F32),
    "gelu_apprx_sigmoid_dx": lambda x: (_sigmoid(F32(1.702) * x) * (1 + F32(1.702) * x * (1 - _sigmoid(F32(1.702) * x)))).astype(F32),
    "bypass": lambda x: x,
    "gelu_dx": lambda x: (0.5 * (1.0 + _erf(x / np.sqrt(F32(2)))) + x * np.exp(-0.5 * x * x) / np.sqrt(F32(2 * np.pi))).astype(F32),
    "silu": lambda x: (x * _sigmoid(x)).astype(F32),
    "silu_dx": lambda x: (_sigmoid(x) * (1 + x * (1 - _sigmoid(x)))).astype(F32),
    "softplus": lambda x: np.logaddexp(F32(0), x).astype(F32),
    "mish": lambda x: (x * np.tanh(np.logaddexp(F32(0), x))).astype(F32),
    "erf": _erf,
    "erf_dx": lambda x: (2.0 / np.sqrt(np.pi) * np.exp(-x * x)).astype(F32),
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "arctan": np.arctan,
    "abs": np.abs, "negative": np.negative, "sign": np.sign,
    "square": np.square, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc,
    "copy": lambda x: x, "identity": lambda x: x,
    "logical_not": lambda x: (x == 0).astype(F32),
}

# Reductions named by a non-ufunc NumPy function, and the binary op behind them.
_NUMPY_ALIASES = {
    id(np.max): np.maximum, id(np.amax): np.maximum, id(np.min): np.minimum,
    id(np.amin): np.minimum, id(np.sum): np.add, id(np.prod): np.multiply,
}

COMPARISONS = {np.equal, np.not_equal, np.greater, np.greater_equal, np.less, np.less_equal,
               np.logical_and, np.logical_or, np.logical_xor}
BITWISE = {np.bitwise_and, np.bitwise_or, np.bitwise_xor, np.left_shift, np.right_shift}


def _abs_max(a, b):
    return np.where(np.abs(a) >= np.abs(b), a, b)


def _abs_min(a, b):
    return np.where(np.abs(a) <= np.abs(b), a, b)


def _bypass(a, b):
    return a


def resolve_binary(op):
    """NumPy binary function for an ``op=`` value (nl function or ufunc)."""
    f = getattr(op, "_binary", None)
    if f is not None:
        return f
    if isinstance(op, np.ufunc) and op.nin == 2:
        return op
    f = _NUMPY_ALIASES.get(id(op))
    if f is not None:
        return f
    raise NKITypeError(f"{getattr(op, '__name__', op)!r} is not a binary operator")


def resolve_unary(op):
    """NumPy float32 function for an activation ``op=`` value."""
    if op is None:
        return UNARY["copy"]
    f = getattr(op, "_unary", None)
    if f is not None:
        return f
    if isinstance(op, np.ufunc) and op.nin == 1:
        return op
    name = getattr(op, "__name__", None)
    if name in UNARY:
        return UNARY[name]
    raise NKITypeError(f"{name or op!r} is not an activation function")


def reduce_values(op, values, axis, keepdims=False):
    f = resolve_binary(op)
    if isinstance(f, np.ufunc):
        return f.reduce(values, axis=axis, keepdims=keepdims)
    raise NKITypeError(f"{getattr(op, '__name__', op)!r} cannot be used as a reduction")


def normalize_axis(axis, ndim):
    if axis is None:
        return tuple(range(1, ndim))
    if isinstance(axis, (list, tuple)):
        return tuple(a % ndim for a in axis)
    return (int(axis) % ndim,)


# ------------------------------------------------------------------ operands
def operand(x, what, mask=None):
    """(float32 values, dtype or None) of an instruction operand.

    Tiles must be on chip: engines cannot read HBM.  Python numbers and index
    grids (NumPy arrays from nl.arange) are immediate values with no dtype of
    their own.
    """
    if isinstance(x, NkiTensor):
        if not x.buffer.on_chip:
            raise NKITypeError(f"{what}: operand {x!r} is in {x.buffer.value}; engines only read SBUF/PSUM, "
                               f"load it first (nl.load / nisa.dma_copy)")
        return x.compute_values(mask, what), x.dtype
    if isinstance(x, np.ndarray):
        return x.astype(F32), None
    if isinstance(x, (bool, np.bool_)):
        return F32(bool(x)), None
    if isinstance(x, (int, float, np.integer, np.floating)):
        return F32(x), None
    raise NKITypeError(f"{what}: unsupported operand of type {type(x).__name__}")


def result(values, dtype, mask=None, buffer: Buffer = Buffer.sbuf, name: str = ""):
    """A new tile holding an instruction's float32 result, rounded to ``dtype``."""
    values = np.asarray(values)
    if values.dtype != F32:
        values = values.astype(F32)
    dtype = _dt.normalize(dtype) if dtype is not None else _dt.float32
    shape = values.shape if values.ndim else (1, 1)
    if not values.ndim:
        values = values.reshape(shape)
    t = allocate(shape, dtype, buffer, name, values=values)
    t._alloc.exact = values
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if mask.ndim > len(shape):
            # the mask was given over the operand's shape (a reduction's input):
            # an output element is live if its partition/leading index is
            mask = mask.any(axis=tuple(range(len(shape), mask.ndim)))
        t._mask = np.broadcast_to(align_to(mask, shape), shape).astype(bool, copy=False)
    return t


def out_shape(*vals):
    shape = ()
    for v in vals:
        s = np.shape(v)
        if s:
            shape = pair_shapes(shape, s) if shape else tuple(s)
    return shape


@instruction
def binary(f, a, b, *, dtype=None, mask=None, what=None):
    what = what or getattr(f, "__name__", "operation")
    if f in BITWISE:
        va, da = _int_operand(a, what)
        vb, db = _int_operand(b, what)
    else:
        va, da = operand(a, what)
        vb, db = operand(b, what)
    shape = out_shape(va, vb)
    if shape:
        va = align_to(va, shape) if np.ndim(va) else va
        vb = align_to(vb, shape) if np.ndim(vb) else vb
    with np.errstate(all="ignore"):
        r = f(va, vb)
    out = dtype if dtype is not None else (_dt.promote(da, db) or _dt.float32)
    return result(np.asarray(r).astype(F32), out, mask)


def _int_operand(x, what):
    if isinstance(x, NkiTensor):
        v, d = operand(x, what)
        return x.read().astype(np.int64) if _dt.is_int(x.dtype) or x.dtype == np.bool_ else v.astype(np.int64), d
    return np.asarray(x).astype(np.int64), None


@instruction
def unary(f, x, *, dtype=None, mask=None, what=None):
    v, d = operand(x, what or getattr(f, "__name__", "operation"))
    with np.errstate(all="ignore"):
        r = f(v)
    return result(np.asarray(r).astype(F32), dtype if dtype is not None else (d or _dt.float32), mask)


def reduce_mask(mask, shape, axes, keepdims):
    """The predicate of a reduction's result from one over its operand: an output element is
    computed where any element reduced into it is."""
    if mask is None:
        return None
    m = np.broadcast_to(align_to(np.asarray(mask, dtype=bool), tuple(shape)), tuple(shape))
    return m.any(axis=axes, keepdims=keepdims) if axes else m


def reduce(op, x, axis, *, dtype=None, mask=None, keepdims=False, negate=False, what="reduce"):
    v, d = operand(x, what)
    axes = normalize_axis(axis, v.ndim)
    with np.errstate(all="ignore"):
        r = reduce_values(op, v, axes, keepdims)
    if negate:
        r = -r
    return result(np.asarray(r).astype(F32), dtype if dtype is not None else d,
                  reduce_mask(mask, v.shape, axes, keepdims))


@instruction
def update(target: NkiTensor, f, other):
    """``target op= other`` in place (float32 arithmetic, one rounding)."""
    if not target.buffer.on_chip:
        raise NKITypeError("in-place arithmetic needs an on-chip tile; HBM is written by nl.store / dma_copy")
    mask = other._mask if isinstance(other, NkiTensor) else None
    v, _ = operand(other, "in-place update", mask)
    if mask is None and isinstance(f, np.ufunc) and update_in_place(target, f, v):
        return
    cur = target.compute_values(mask, "in-place update")
    with np.errstate(all="ignore"):
        r = f(cur, align_to(v, cur.shape) if np.ndim(v) else v)
    target.write(np.asarray(r, dtype=F32), mask)


def update_in_place(target: NkiTensor, f, v, whole_group=False) -> bool:
    """``target = f(target, v)`` computed straight into float32 storage (PSUM
    accumulation in a K loop), if possible: the same float32 arithmetic as
    read-compute-write, without the copies.  ``whole_group``: only if every
    element already belongs to the PSUM accumulation group."""
    arr, alloc = target._arr, target._alloc
    if arr is None or alloc.dtype is _dt.tfloat32 or alloc.dtype != F32 or alloc.readonly:
        return False
    if whole_group and not target._psum_valid_view().all():
        return False
    with np.errstate(all="ignore"):
        f(arr, align_to(v, arr.shape) if np.ndim(v) else v, out=arr)
    alloc.written = True
    alloc.exact = None
    if alloc.psum_valid is not None:
        target._mark_psum_valid(None)
    return True


@instruction
def broadcast_to(x: NkiTensor, shape):
    v, d = operand(x, "broadcast_to")
    return result(np.array(align_to(v, tuple(shape))), d)


# ------------------------------------------------------------------- matmul
def matmul_values(stationary: NkiTensor, moving: NkiTensor, what="nc_matmul", require_sbuf=True):
    """stationary.T @ moving in float32, with the Tensor Engine's tile limits."""
    for name, t in (("stationary", stationary), ("moving", moving)):
        if not isinstance(t, NkiTensor) or not t.buffer.on_chip:
            raise NKITypeError(f"{what}: {name} must be an on-chip tile, got {t!r}")
        if require_sbuf and t.buffer is not Buffer.sbuf:
            raise NKITypeError(f"{what}: {name} must be in SBUF (the Tensor Engine reads SBUF), got {t.buffer.value}")
    s2 = _gemm_operand(stationary, what)
    m2 = _gemm_operand(moving, what)
    s2 = s2.reshape(s2.shape[0], -1)
    m2 = m2.reshape(m2.shape[0], -1)
    k = s2.shape[0]
    if k != m2.shape[0]:
        raise NKITypeError(f"{what}: contraction (partition) sizes differ: stationary {tuple(stationary.shape)}, "
                           f"moving {tuple(moving.shape)}")
    if k > TileSize.pmax:
        raise NKILimitError("nl.tile_size.pmax", k, TileSize.pmax, f"{what} contraction (partition) size")
    check_gemm_free_sizes(s2, m2, what)
    return tile_gemm(s2, m2)


def check_gemm_free_sizes(s2, m2, what):
    """The Tensor Engine's free-size limits on [K, free] operands."""
    if s2.shape[1] > TileSize.gemm_stationary_fmax:
        raise NKILimitError("nl.tile_size.gemm_stationary_fmax", s2.shape[1], TileSize.gemm_stationary_fmax,
                            f"{what} stationary free size")
    if m2.shape[1] > TileSize.gemm_moving_fmax:
        raise NKILimitError("nl.tile_size.gemm_moving_fmax", m2.shape[1], TileSize.gemm_moving_fmax,
                            f"{what} moving free size")


def _gemm_operand(t: NkiTensor, what):
    """What the Tensor Engine reads of ``t``: its bfloat16 storage where that is
    its value (``tile_gemm`` then multiplies it as it is), else its float32 values."""
    if BF16_TILE_GEMM and t.dtype == _dt.bfloat16:
        t.check_bounds(None, what)
        if t.exact_values() is None:
            return t.read()
    return t.compute_values(None, what)


def _bf16_tile_gemm():
    """torchneuron._C's bfloat16 tile GEMM, or None: no matrix unit on this host,
    TORCHNEURON_NKI_BF16_GEMM=0 (a float32 BLAS GEMM for every tile), or the
    emulator without the extension."""
    if os.environ.get("TORCHNEURON_NKI_BF16_GEMM", "1") == "0":
        return None
    try:
        from .. import _C  # optional: the emulator runs without the extension
    except ImportError:
        return None
    return _C if _C._nki_tile_gemm_bf16_available() else None


_C_NKI = _bf16_tile_gemm()
BF16_TILE_GEMM = _C_NKI is not None
# A tile staged for the matrix unit (stage_tile); .source is its array, .cols its columns.
StagedTile = _C_NKI._NkiStagedTile if BF16_TILE_GEMM else type("StagedTile", (), {})


def _bf16_ready(a) -> bool:
    """Whether the matrix unit takes ``a`` as it is: staged, or bfloat16 rows
    (an even, non-zero number of them) that are contiguous."""
    return isinstance(a, StagedTile) or (a.dtype == _dt.bfloat16 and a.shape[0] % 2 == 0 and a.shape[0]
                                         and a.shape[1] and a.strides[1] == 2)


def _cols(a) -> int:
    return a.cols if isinstance(a, StagedTile) else a.shape[1]


def stage_tile(a: np.ndarray, stationary: bool, into=None):
    """``a`` (K x ...) as ``tile_gemm``'s stationary or moving operand, staged for
    the matrix unit once so that every GEMM reading it skips that work (into the
    storage of ``into``, a StagedTile no longer used, if given); the 2-D array
    itself where the matrix unit would not take it. The staged form does not
    follow later writes to ``a``."""
    a = a.reshape(a.shape[0], -1)
    limit = TileSize.gemm_stationary_fmax if stationary else TileSize.gemm_moving_fmax
    if BF16_TILE_GEMM and _bf16_ready(a) and a.shape[0] <= TileSize.pmax and a.shape[1] <= limit:
        return _C_NKI._nki_stage_bf16(a, stationary, into if isinstance(into, StagedTile) else None)
    return a


def tile_gemm_chain(pairs, out: np.ndarray) -> np.ndarray:
    """``tile_gemm(s, m, out)`` for each (s, m) of ``pairs`` in turn: the same
    bits, in one pass over ``out`` where every operand is a ``StagedTile``."""
    if BF16_TILE_GEMM and out.strides[1] == 4 and all(isinstance(x, StagedTile) for p in pairs for x in p):
        _C_NKI._nki_tile_gemm_chain_bf16(pairs, out, True)
        return out
    for s, m in pairs:
        tile_gemm(s, m, out)
    return out


def tile_gemm(s, m, out: np.ndarray | None = None) -> np.ndarray:
    """``s.T @ m`` in float32 for 2-D tiles ``s`` (K x M) and ``m`` (K x N); with
    ``out`` (float32, M x N), ``out += s.T @ m`` (the sum rounded, then added).
    Either operand may be a ``StagedTile`` of ``stage_tile``.

    Products of bfloat16, float16 and fp8 values are exact in float32 and the
    sums accumulate in float32, as in the PE array. Two bfloat16 operands go to
    the host's bfloat16 matrix unit where it has one (csrc/bridge/kernels/nki_host.h),
    anything else to a float32 BLAS GEMM; the two sum in different orders."""
    if BF16_TILE_GEMM and _bf16_ready(s) and _bf16_ready(m) and (out is None or out.strides[1] == 4):
        if out is None:
            out = np.empty((_cols(s), _cols(m)), F32)
            _C_NKI._nki_tile_gemm_bf16(s, m, out, False)
            return out
        _C_NKI._nki_tile_gemm_bf16(s, m, out, True)
        return out
    if isinstance(s, StagedTile):
        s = s.source
    if isinstance(m, StagedTile):
        m = m.source
    if s.dtype != F32:
        s = s.astype(F32)
    if m.dtype != F32:
        m = m.astype(F32)
    r = np.matmul(s.T, m, dtype=F32)
    if out is None:
        return r
    with np.errstate(all="ignore"):
        return np.add(out, r, out=out)


register_arithmetic(binary=binary, unary=unary, update=update, broadcast_to=broadcast_to)  # tile operators
