"""nki.isa: single NeuronCore instructions, in both calling conventions.

Beta 1 returns the result tile:      ``t = nisa.tensor_copy(src)``
NKI 0.x writes a destination first:  ``nisa.tensor_copy(dst, src)`` / ``dst=``

Each instruction accepts both.  The destination form is recognised by a
``dst=`` keyword, by one positional argument more than the beta-1 signature
takes, or by a tile where beta-1 expects an operator (and vice versa).
"""
from __future__ import annotations

import math
import enum

import ml_dtypes
import numpy as np

from . import dtypes as _dt
from . import ops as _ops
from . import lnc as _lnc
from .context import current, in_kernel as _in_kernel
from .errors import NKILimitError, NKIOutOfBoundsError, NKITypeError
from .machine import Buffer, TileSize, default_target as _default_target
from .registers import VirtualRegister
from .tensor import NkiTensor, align_to, allocate
from .instruction import active as _recording, instructions

F32 = np.float32


# ------------------------------------------------------------------- enums
class engine(enum.Enum):
    tensor = "tensor"
    vector = "vector"
    scalar = "scalar"
    gpsimd = "gpsimd"
    sync = "sync"
    unknown = "unknown"


tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown


class reduce_cmd(enum.Enum):
    """Control of an engine's accumulation register for instructions with ``reduce_res``."""

    idle = "idle"
    reset = "reset"
    reduce = "reduce"
    reset_reduce = "reset_reduce"
    load_reduce = "load_reduce"


class nc_version(enum.IntEnum):
    gen2 = 2
    gen3 = 3
    gen4 = 4


def get_nc_version():
    """The NeuronCore generation of the machine the kernel runs on (``set_machine``/``target=``)."""
    return nc_version((current().launch.target if _in_kernel() else _default_target()).generation)


class matmul_perf_mode(enum.Enum):
    """``nc_matmul(perf_mode=)``: ``double_row`` is FP8 double-row mode, whose operands carry the
    contraction over the partition axis and a first free axis of 2 (see ``_double_row_values``)."""

    none = "none"
    double_row = "double_row"


class dma_engine(enum.Enum):
    dma = 1
    gpsimd_dma = 2


def get_nc_sub_version():
    """The NeuronCore sub-version (0: the machine models have none)."""
    return 0


class dge_mode(enum.Enum):
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.Enum):
    """``dma_copy(oob_mode=)``: an indirect access outside its tensor raises (``error``) or is not
    transferred (``skip``)."""

    error = 0
    skip = 1


# ------------------------------------------------------------ conventions
def _style(args, kwargs, old_kinds):
    """Split a call into (dst or None, bound old-style arguments).

    ``old_kinds`` names the beta-1 positional parameters with their kind:
    'T' tile, 'F' operator, 'A' anything.
    """
    names = [n for n, _ in old_kinds]
    # a positional argument whose beta-1 name is also given by keyword can only be the destination
    new = "dst" in kwargs or len(args) > len(old_kinds) or any(n in kwargs for n in names[:len(args)])
    if not new:
        for a, (_, kind) in zip(args, old_kinds):
            if (kind == "T" and not isinstance(a, NkiTensor)) or (kind == "F" and isinstance(a, NkiTensor)):
                new = True
                break
    kw = dict(kwargs)
    if new:
        if "dst" in kw:
            dst = kw.pop("dst")
        else:
            dst, args = args[0], args[1:]
    else:
        dst = None
    for n, a in zip(names, args):
        if n in kw:
            raise TypeError(f"argument {n!r} given twice")
        kw[n] = a
    if len(args) > len(names):
        raise TypeError(f"too many positional arguments (expected {names})")
    return dst, kw


def _emit(dst, values, dtype, *, mask=None, buffer=Buffer.sbuf, name=""):
    """Deliver an instruction result: into ``dst`` (0.x) or as a new tile (beta 1)."""
    if dst is None:
        return _ops.result(values, dtype, mask, buffer, name)
    if not isinstance(dst, NkiTensor) or not dst.buffer.on_chip:
        raise NKITypeError(f"{name}: dst must be an SBUF or PSUM tile, got {dst!r}")
    dst.write(align_to(np.asarray(values, dtype=F32), dst.shape), _mask(mask, dst.shape))
    return dst


def _mask(mask, shape):
    if mask is None:
        return None
    return align_to(np.asarray(mask, dtype=bool), shape)


def _tile(x, what):
    if not isinstance(x, NkiTensor):
        raise NKITypeError(f"{what} must be a tile, got {type(x).__name__}")
    return x


def _values(x, what, mask=None):
    return _ops.operand(x, what, mask)


def _free_reduce(op, values):
    axes = tuple(range(1, values.ndim))
    return _ops.reduce_values(op, values, axes, keepdims=True).reshape(values.shape[0], 1)


def _accumulate(eng, op, partial, cmd):
    """Engine accumulation register update for ``reduce_cmd``; returns the register."""
    regs = current().accumulators
    cmd = reduce_cmd.reset_reduce if cmd is None else cmd
    if cmd in (reduce_cmd.reset_reduce, reduce_cmd.reset, reduce_cmd.load_reduce) or eng not in regs:
        regs[eng] = partial
    elif cmd is reduce_cmd.reduce:
        regs[eng] = _ops.resolve_binary(op)(regs[eng], partial).astype(F32)
    return regs[eng]


def _write_reduce_res(reduce_res, values):
    if reduce_res is None:
        return
    _tile(reduce_res, "reduce_res").write(align_to(values, reduce_res.shape))


# ------------------------------------------------------------ Tensor Engine
def nc_matmul(*args, **kwargs):
    """stationary.T @ moving into PSUM (float32).

    Destination form: ``accumulate=None`` adds into elements of ``dst`` already
    written since allocation and overwrites the others (the hardware's
    accumulation group starts at the first matmul into a fresh PSUM tile);
    True always adds, False always overwrites.
    """
    dst, kw = _style(args, kwargs, [("stationary", "T"), ("moving", "T")])
    if _is_double_row(kw.get("perf_mode")):
        r = _double_row_values(kw["stationary"], kw["moving"])
    else:
        r = _ops.matmul_values(kw["stationary"], kw["moving"], "nisa.nc_matmul")
    if dst is None:
        return _ops.result(r, _dt.float32, kw.get("mask"), Buffer.psum, "nc_matmul")
    return _into_psum(dst, r, kw.get("accumulate"), "nisa.nc_matmul")


def _is_double_row(mode):
    return mode is matmul_perf_mode.double_row or mode == "double_row" or getattr(mode, "value", None) == "double_row"


_DOUBLE_ROW_TYPES = {3: ("float8_e4m3", "float8_e5m2"), 4: ("float8_e4m3", "float8_e5m2", "float8_e4m3fn")}


def _double_row_values(stationary, moving):
    """FP8 double-row mode (NeuronCore-v3 and newer): the contraction runs over the partition axis
    and the first free axis, of size 2, of both operands: stationary [K, 2, M] and moving [K, 2, N]
    give the [M, N] product of 2K-long contractions.  The stationary free size limit applies to M."""
    what = "nisa.nc_matmul(perf_mode=double_row)"
    generation = current().launch.target.generation
    if generation < 3:
        raise NKITypeError(f"{what} needs NeuronCore-v3 or newer")
    allowed = _DOUBLE_ROW_TYPES[min(generation, 4)]
    operands = []
    for name, t in (("stationary", stationary), ("moving", moving)):
        t = _tile(t, f"{what} {name}")
        if t.buffer is not Buffer.sbuf:
            raise NKITypeError(f"{what}: {name} must be in SBUF, got {t.buffer.value}")
        if _dt.name(t.dtype) not in allowed:
            raise NKITypeError(f"{what}: {name} must be one of {', '.join(allowed)}, got {_dt.name(t.dtype)}")
        if len(t.shape) < 3 or t.shape[1] != 2:
            raise NKITypeError(f"{what}: {name} must be [K, 2, ...] (the contraction split over the partition "
                               f"axis and a first free axis of 2), got {tuple(t.shape)}")
        operands.append(t)
    if {_dt.name(t.dtype) for t in operands} == {"float8_e4m3", "float8_e4m3fn"}:
        raise NKITypeError(f"{what}: float8_e4m3 and float8_e4m3fn cannot be mixed")
    s, m = (t.compute_values(None, what) for t in operands)
    k = s.shape[0]
    if k != m.shape[0]:
        raise NKITypeError(f"{what}: partition sizes differ: stationary {tuple(s.shape)}, moving {tuple(m.shape)}")
    if k > TileSize.pmax:
        raise NKILimitError("nl.tile_size.pmax", k, TileSize.pmax, f"{what} partition size")
    s2, m2 = s.reshape(2 * k, -1), m.reshape(2 * k, -1)
    _ops.check_gemm_free_sizes(s2, m2, what)
    rec = _recording()
    if rec is not None:  # the lowered replay reads operands as [K, free]: interpret this signature
        rec.poison("nc_matmul(perf_mode=double_row), which replay does not lower")
    return _ops.tile_gemm(np.ascontiguousarray(s2), np.ascontiguousarray(m2))


def _into_psum(dst, r, acc, what):
    """Write or accumulate a matmul result into a PSUM tile (see nc_matmul for ``accumulate``)."""
    dst = _tile(dst, f"{what} dst")
    if dst.buffer is not Buffer.psum:
        raise NKITypeError(f"{what} writes PSUM; dst is in " + dst.buffer.value)
    r = align_to(r, dst.shape)
    if acc is not False and _ops.update_in_place(dst, np.add, r, whole_group=acc is None):
        return dst
    if acc is False:
        new = r
    else:
        cur = dst.compute_values(None, f"{what} accumulate")
        if acc is None:
            cur = np.where(dst._psum_valid_view(), cur, F32(0))
        new = cur + r
    dst.write(new)
    return dst


# ------------------------------------------------------- MX (NeuronCore-v4)
def _require_mx(what):
    m = current().launch.target
    if not m.mx_matmul:
        raise NKITypeError(f"{what} is available only on NeuronCore-v4 (Trainium3); the kernel runs on "
                           f"{m.device} ({m.name}): select trn3 with set_machine, TORCHNEURON_MACHINE or "
                           f"@nki.jit(platform_target='trn3')")


def _scale_rows(partitions):
    """Row of the scale tile holding the scale of each data partition's group: the 8-partition groups of
    a 32-partition quadrant keep their scales in the quadrant's first 4 rows."""
    p = np.arange(partitions)
    return (p // 32) * 32 + (p % 32) // 8


def _mx_operand(data, scale, what):
    data, scale = _tile(data, what), _tile(scale, what + " scale")
    dt = data.dtype
    if not isinstance(dt, _dt.Packed):
        raise NKITypeError(f"{what} must be float8_e5m2_x4, float8_e4m3fn_x4 or float4_e2m1fn_x4, got {_dt.name(dt)}")
    for t, name in ((data, what), (scale, what + "_scale")):
        if t.buffer is not Buffer.sbuf:
            raise NKITypeError(f"nisa.nc_matmul_mx: {name} must be in SBUF, got {t.buffer.value}")
    if _dt.name(scale.dtype) not in ("uint8", "float8_e8m0fnu"):
        raise NKITypeError(f"nisa.nc_matmul_mx: scales must be uint8 or float8_e8m0fnu, got {_dt.name(scale.dtype)}")
    raw = data.raw_values(None, what)
    k, f = raw.shape[0], int(math.prod(raw.shape[1:]))
    if k % 32 or k > TileSize.pmax:
        raise NKILimitError("nc_matmul_mx partition size", k, TileSize.pmax,
                            f"{what} partition size (a multiple of 32)")
    vals = dt.unpack(raw.reshape(k, f))                      # [K, F, 4]
    rows = _scale_rows(k)
    sc = scale.raw_values(None, what + " scale").reshape(scale.shape[0], -1)
    if sc.shape[0] <= rows.max() or sc.shape[1] < f:
        raise NKITypeError(f"nisa.nc_matmul_mx: the {what} scale tile {tuple(scale.shape)} does not cover "
                           f"{tuple(raw.shape)} data (scales of partition p in row (p//32)*32 + (p%32)//8)")
    factors = np.ldexp(np.float32(1), sc.view(np.uint8)[rows, :f].astype(np.int32) - 127).astype(F32)
    return vals * factors[:, :, None], k, f


def nc_matmul_mx(*args, **kwargs):
    """MX matmul (NeuronCore-v4): dequantised stationary.T @ moving into PSUM.

    ``stationary`` [K, M] and ``moving`` [K, N] hold packed MX values (each
    element four contraction values); their scale tiles give one power of two
    per group of 8 partitions x 4 packed values.  ``accumulate`` as for
    nc_matmul; a bfloat16 ``dst`` rounds the float32 sum once."""
    kw = dict(kwargs)
    names = ["dst", "stationary", "moving", "stationary_scale", "moving_scale"]
    for n, a in zip(names, args):
        kw[n] = a
    _require_mx("nisa.nc_matmul_mx")
    s, k, m = _mx_operand(kw["stationary"], kw["stationary_scale"], "stationary")
    v, k2, n = _mx_operand(kw["moving"], kw["moving_scale"], "moving")
    if k != k2:
        raise NKITypeError(f"nisa.nc_matmul_mx: contraction sizes differ: stationary {k}, moving {k2}")
    if m > TileSize.gemm_stationary_fmax:
        raise NKILimitError("nl.tile_size.gemm_stationary_fmax", m, TileSize.gemm_stationary_fmax,
                            "nc_matmul_mx stationary free size")
    r = np.matmul(s.transpose(1, 0, 2).reshape(m, k * 4), v.transpose(0, 2, 1).reshape(k * 4, n), dtype=F32)
    return _into_psum(kw["dst"], r, kw.get("accumulate"), "nisa.nc_matmul_mx")


_MX_MAX_EXP = {"float8_e4m3fn": 8, "float8_e5m2": 15}


def quantize_mx(*args, **kwargs):
    """Quantize bf16/fp16 ``src`` [P, F] to MXFP8 (NeuronCore-v4): ``dst`` [P, F/4] packed values and
    ``dst_scale`` one scale per group of 8 partitions x 4 values (in the scale-row layout of nc_matmul_mx).

    The scale of a group with largest magnitude ``a`` is 2**(floor(log2 a) - (Emax - 1)), Emax 8 for
    float8_e4m3fn and 15 for float8_e5m2 (2**-127 for an all-zero group); values are divided by it,
    saturated to the format's largest finite value and rounded to nearest even."""
    kw = dict(kwargs)
    for n, a in zip(["dst", "src", "dst_scale"], args):
        kw[n] = a
    _require_mx("nisa.quantize_mx")
    dst, src, dscale = _tile(kw["dst"], "dst"), _tile(kw["src"], "src"), _tile(kw["dst_scale"], "dst_scale")
    for t, name in ((dst, "dst"), (src, "src"), (dscale, "dst_scale")):
        if t.buffer is not Buffer.sbuf:
            raise NKITypeError(f"nisa.quantize_mx: {name} must be in SBUF, got {t.buffer.value}")
    if not isinstance(dst.dtype, _dt.Packed) or dst.dtype.bits != 8:
        raise NKITypeError(f"nisa.quantize_mx: dst must be float8_e5m2_x4 or float8_e4m3fn_x4, got {_dt.name(dst.dtype)}")
    if _dt.name(src.dtype) not in ("bfloat16", "float16"):
        raise NKITypeError(f"nisa.quantize_mx: src must be bfloat16 or float16, got {_dt.name(src.dtype)}")
    v, _ = _values(src, "nisa.quantize_mx")
    p = v.shape[0]
    v = v.reshape(p, -1)
    f = v.shape[1]
    if p % 32 or p > TileSize.pmax or f % 4:
        raise NKITypeError(f"nisa.quantize_mx: src {tuple(src.shape)} must have a multiple of 32 partitions "
                           f"(at most 128) and a free size that is a multiple of 4")
    elem = dst.dtype.element
    emax = _MX_MAX_EXP[elem.name]
    fmax = float(ml_dtypes.finfo(elem).max)
    groups = np.abs(v).reshape(p // 8, 8, f // 4, 4).max(axis=(1, 3))           # [P/8, F/4]
    _, e = np.frexp(groups)
    exp = np.where(groups > 0, e - 1 - (emax - 1), -127)
    biased = np.clip(exp + 127, 0, 254).astype(np.uint8)
    scale = np.ldexp(np.float32(1), biased.astype(np.int32) - 127).astype(F32)
    per_elem = np.repeat(np.repeat(scale, 8, axis=0), 4, axis=1)                # [P, F]
    q = np.clip(v / per_elem, -fmax, fmax).reshape(p, f // 4, 4)
    dst.write(dst.dtype.pack(q).reshape(dst.shape))
    rows = _scale_rows(p)[::8]
    out = np.zeros(tuple(dscale.shape), dtype=_dt.storage(dscale.dtype)).reshape(dscale.shape[0], -1)
    if out.shape[0] <= rows.max() or out.shape[1] < f // 4:
        raise NKITypeError(f"nisa.quantize_mx: dst_scale {tuple(dscale.shape)} cannot hold the scales of "
                           f"{tuple(src.shape)} (partition groups in rows (p//32)*32 + (p%32)//8)")
    cur = dscale.raw_values(None, "dst_scale").reshape(out.shape).copy()
    cur.view(np.uint8)[rows, :f // 4] = biased
    dscale.write(cur.reshape(dscale.shape))
    return dst


def nc_transpose(*args, **kwargs):
    """Swap partition and free axis of a 2-D tile (Tensor Engine: <=128x128 into PSUM;
    Vector Engine: <=32x32 into SBUF)."""
    dst, kw = _style(args, kwargs, [("data", "T")])
    data = _tile(kw["data"], "nc_transpose data")
    v, d = _values(data, "nisa.nc_transpose")
    v = v.reshape(v.shape[0], -1)
    eng = kw.get("engine", engine.unknown)
    on_vector = eng is engine.vector
    limit = 32 if on_vector else TileSize.pmax
    for size, what in ((v.shape[0], "partition size"), (v.shape[1], "free size")):
        if size > limit:
            raise NKILimitError("nc_transpose " + ("vector engine 32x32" if on_vector else "nl.tile_size.pmax"),
                                size, limit, f"nc_transpose input {what}")
    buf = Buffer.sbuf if on_vector else Buffer.psum
    return _emit(dst, np.ascontiguousarray(v.T), kw.get("dtype") or d, buffer=buf, name="nc_transpose")


# ------------------------------------------------------ Vector/Scalar/GpSimd
def activation(*args, **kwargs):
    """op(data * scale + bias), with an optional reduction of the result along the free axes."""
    dst, kw = _style(args, kwargs, [("op", "F"), ("data", "T"), ("bias", "A"), ("scale", "A")])
    f = _ops.resolve_unary(kw["op"])
    v, d = _values(kw["data"], "nisa.activation")
    scale = kw.get("scale", 1.0)
    bias = kw.get("bias")
    x = v
    if not (isinstance(scale, (int, float)) and scale == 1.0):
        s, _ = _values(scale, "activation scale")
        x = x * (align_to(s, v.shape) if np.ndim(s) else s)
    if bias is not None:
        b, _ = _values(bias, "activation bias")
        x = x + align_to(b, v.shape)
    with np.errstate(all="ignore"):
        out = np.asarray(f(x.astype(F32, copy=False)), dtype=F32)
    reduce_op = kw.get("reduce_op")
    reduce_res = kw.get("reduce_res")
    if reduce_res is not None:
        op = reduce_op if reduce_op is not None else np.add
        reg = _accumulate(engine.scalar, op, _free_reduce(op, out), kw.get("reduce_cmd"))
        _write_reduce_res(reduce_res, reg)
    return _emit(dst, out, kw.get("dtype") or d, mask=kw.get("mask"), name="activation")


def activation_reduce(*args, **kwargs):
    """activation() whose result is also reduced (``reduce_op``) into ``reduce_res``."""
    dst, kw = _style(args, kwargs, [("op", "F"), ("data", "T"), ("reduce_op", "F"), ("reduce_res", "T"),
                                    ("bias", "A"), ("scale", "A")])
    if dst is not None:
        kw["dst"] = dst
    kw.setdefault("reduce_cmd", reduce_cmd.reset_reduce)
    return activation(**kw)


def tensor_reduce(*args, **kwargs):
    """Reduce ``data`` along free ``axis`` with ``op`` (optionally negated)."""
    dst, kw = _style(args, kwargs, [("op", "F"), ("data", "T"), ("axis", "A")])
    v, d = _values(kw["data"], "nisa.tensor_reduce")
    axes = _ops.normalize_axis(kw.get("axis"), v.ndim)
    if 0 in axes and v.ndim > 1:
        raise NKITypeError("nisa.tensor_reduce reduces free axes only; use tensor_partition_reduce for axis 0")
    with np.errstate(all="ignore"):
        r = _ops.reduce_values(kw["op"], v, axes, kw.get("keepdims", False))
    if kw.get("negate", False):
        r = -r
    mask = kw.get("mask")
    if mask is not None and np.ndim(mask) == v.ndim:
        mask = _ops.reduce_mask(mask, v.shape, axes, kw.get("keepdims", False))
    return _emit(dst, np.asarray(r, dtype=F32), kw.get("dtype") or d, mask=mask, name="tensor_reduce")


def tensor_partition_reduce(*args, **kwargs):
    """Reduce across partitions (axis 0) with ``op`` on the GpSimd Engine."""
    dst, kw = _style(args, kwargs, [("op", "F"), ("data", "T")])
    v, d = _values(kw["data"], "nisa.tensor_partition_reduce")
    r = _ops.reduce_values(kw["op"], v, (0,), keepdims=True)
    return _emit(dst, np.asarray(r, dtype=F32), kw.get("dtype") or d, name="tensor_partition_reduce")


def tensor_tensor(*args, **kwargs):
    """op(data1, data2) element-wise on two tiles (not both in PSUM)."""
    dst, kw = _style(args, kwargs, [("data1", "T"), ("data2", "T"), ("op", "F")])
    a, b = _tile(kw["data1"], "data1"), _tile(kw["data2"], "data2")
    if a.buffer is Buffer.psum and b.buffer is Buffer.psum:
        raise NKITypeError("nisa.tensor_tensor: data1 and data2 cannot both be in PSUM")
    f = _ops.resolve_binary(kw["op"])
    va, da = _values(a, "nisa.tensor_tensor")
    vb, db = _values(b, "nisa.tensor_tensor")
    shape = _ops.out_shape(va, vb)
    with np.errstate(all="ignore"):
        r = np.asarray(f(align_to(va, shape), align_to(vb, shape)), dtype=F32)
    return _emit(dst, r, kw.get("dtype") or _dt.promote(da, db), mask=kw.get("mask"), name="tensor_tensor")


def _apply(op, data, operand, reverse):
    try:
        f = _ops.resolve_binary(op)
    except NKITypeError:
        # a unary operator (``op0=nl.abs``) applies to the data; its operand must be the neutral 0
        g = _ops.resolve_unary(op)
        if np.ndim(operand) != 0 or float(operand) != 0.0:
            raise NKITypeError(f"{getattr(op, '__name__', op)!r} is unary: as an operator of tensor_scalar its "
                               f"operand must be 0.0, got {operand!r}") from None
        with np.errstate(all="ignore"):
            return np.asarray(g(data), dtype=F32)
    o = operand if np.ndim(operand) == 0 else align_to(operand, data.shape)
    with np.errstate(all="ignore"):
        return np.asarray(f(o, data) if reverse else f(data, o), dtype=F32)


def tensor_scalar(*args, **kwargs):
    """(data op0 operand0) op1 operand1, operands scalars or one value per partition."""
    dst, kw = _style(args, kwargs, [("data", "T"), ("op0", "F"), ("operand0", "A"), ("reverse0", "A"),
                                    ("op1", "F"), ("operand1", "A"), ("reverse1", "A")])
    v, d = _values(kw["data"], "nisa.tensor_scalar")
    o0, _ = _values(kw["operand0"], "operand0")
    r = _apply(kw["op0"], v, o0, kw.get("reverse0", False))
    if kw.get("op1") is not None:
        o1, _ = _values(kw["operand1"], "operand1")
        r = _apply(kw["op1"], r, o1, kw.get("reverse1", False))
    return _emit(dst, r, kw.get("dtype") or d, mask=kw.get("mask"), name="tensor_scalar")


def tensor_scalar_reduce(*args, **kwargs):
    """tensor_scalar with one operator, also reducing the result into ``reduce_res``."""
    dst, kw = _style(args, kwargs, [("data", "T"), ("op0", "F"), ("operand0", "A"), ("reduce_op", "F"),
                                    ("reduce_res", "T"), ("reverse0", "A")])
    v, d = _values(kw["data"], "nisa.tensor_scalar_reduce")
    o0, _ = _values(kw["operand0"], "operand0")
    r = _apply(kw["op0"], v, o0, kw.get("reverse0", False))
    _write_reduce_res(kw["reduce_res"], _free_reduce(kw["reduce_op"], r))
    return _emit(dst, r, kw.get("dtype") or d, mask=kw.get("mask"), name="tensor_scalar_reduce")


def scalar_tensor_tensor(*args, **kwargs):
    """(data op0 operand0) op1 operand1, operand0 a scalar/per-partition value, operand1 a tile."""
    dst, kw = _style(args, kwargs, [("data", "T"), ("op0", "F"), ("operand0", "A"), ("op1", "F"),
                                    ("operand1", "T"), ("reverse0", "A"), ("reverse1", "A")])
    v, d = _values(kw["data"], "nisa.scalar_tensor_tensor")
    o0, _ = _values(kw["operand0"], "operand0")
    o1, d1 = _values(kw["operand1"], "operand1")
    r = _apply(kw["op0"], v, o0, kw.get("reverse0", False))
    r = _apply(kw["op1"], r, o1, kw.get("reverse1", False))
    return _emit(dst, r, kw.get("dtype") or _dt.promote(d, d1), mask=kw.get("mask"), name="scalar_tensor_tensor")


def tensor_tensor_scan(*args, **kwargs):
    """Per partition: r[i] = op1(op0(data0[i], r[i-1]), data1[i]), r[-1] = initial."""
    dst, kw = _style(args, kwargs, [("data0", "T"), ("data1", "T"), ("initial", "A"), ("op0", "F"),
                                    ("op1", "F"), ("reverse0", "A"), ("reverse1", "A")])
    v0, d0 = _values(kw["data0"], "nisa.tensor_tensor_scan")
    v1, _ = _values(kw["data1"], "nisa.tensor_tensor_scan")
    a = v0.reshape(v0.shape[0], -1)
    b = v1.reshape(v1.shape[0], -1)
    init, _ = _values(kw["initial"], "initial")
    prev = np.broadcast_to(np.asarray(init, dtype=F32).reshape(-1), (a.shape[0],)).astype(F32)
    op0, op1 = _ops.resolve_binary(kw["op0"]), _ops.resolve_binary(kw["op1"])
    rev0, rev1 = kw.get("reverse0", False), kw.get("reverse1", False)
    out = np.empty_like(a)
    # The recurrence is sequential along the free axis; each step is a vector
    # operation over all partitions at once.
    for i in range(a.shape[1]):
        t = op0(prev, a[:, i]) if rev0 else op0(a[:, i], prev)
        prev = (op1(b[:, i], t) if rev1 else op1(t, b[:, i])).astype(F32)
        out[:, i] = prev
    return _emit(dst, out.reshape(v0.shape), kw.get("dtype") or d0, name="tensor_tensor_scan")


def tensor_copy(*args, **kwargs):
    """Copy a tile between SBUF and PSUM (an engine pass: converts through float32)."""
    dst, kw = _style(args, kwargs, [("src", "T")])
    src = _tile(kw["src"], "tensor_copy src")
    v, d = _values(src, "nisa.tensor_copy")
    return _emit(dst, v, kw.get("dtype") or d, mask=kw.get("mask"), name="tensor_copy")


def tensor_copy_predicated(*args, **kwargs):
    """Copy ``src`` into ``dst`` where ``predicate`` is nonzero."""
    dst, kw = _style(args, kwargs, [("src", "T"), ("predicate", "T")])
    if dst is None:
        raise NKITypeError("nisa.tensor_copy_predicated needs dst")
    v, _ = _values(kw["src"], "nisa.tensor_copy_predicated")
    p, _ = _values(kw["predicate"], "nisa.tensor_copy_predicated")
    pred = align_to(p, dst.shape) != 0
    if kw.get("reverse_pred", False):
        pred = ~pred
    dst.write(align_to(v, dst.shape), pred)
    return dst


def exponential(*args, **kwargs):
    """``dst = exp(src - max_value)`` on the Vector Engine (NeuronCore-v4), optionally accumulating the
    sum of each partition's results into ``reduce_res`` (``reduce_cmd`` as for activation)."""
    kw = dict(kwargs)
    for n, a in zip(["dst", "src", "max_value"], args):
        kw[n] = a
    _require_mx("nisa.exponential")
    v, d = _values(kw["src"], "nisa.exponential")
    mx, _ = _values(kw.get("max_value", 0.0), "max_value")
    x = v - (align_to(mx, v.shape) if np.ndim(mx) else mx)
    with np.errstate(all="ignore"):
        out = np.exp(x.astype(F32)).astype(F32)
    reduce_res = kw.get("reduce_res")
    if reduce_res is not None:
        init, _ = _values(kw.get("reduce_init", 0.0), "reduce_init")
        partial = _free_reduce(np.add, out) + (np.reshape(init, (-1, 1)) if np.ndim(init) else F32(init))
        cmd = kw.get("reduce_cmd", reduce_cmd.idle)
        reg = _accumulate(engine.vector, np.add, partial.astype(F32),
                          reduce_cmd.reset_reduce if cmd is reduce_cmd.idle else cmd)
        _write_reduce_res(reduce_res, reg)
    return _emit(kw["dst"], out, kw.get("dtype") or d, name="exponential")


def reciprocal(*args, **kwargs):
    """1 / data."""
    dst, kw = _style(args, kwargs, [("data", "T")])
    v, d = _values(kw["data"], "nisa.reciprocal")
    with np.errstate(all="ignore"):
        r = (F32(1) / v).astype(F32)
    return _emit(dst, r, kw.get("dtype") or d, mask=kw.get("mask"), name="reciprocal")


def _affine_values(shape, pattern, offset, channel_multiplier):
    parts = shape[0]
    nums = [int(n) for _, n in pattern]
    if int(math.prod(nums)) != int(math.prod(shape[1:])):
        raise NKITypeError(f"pattern {pattern} does not cover the {tuple(shape)} destination")
    val = np.full([parts] + nums, float(offset), dtype=np.float64)
    val += (np.arange(parts) * channel_multiplier).reshape([parts] + [1] * len(nums))
    for k, (step, n) in enumerate(pattern):
        shp = [1] * (len(nums) + 1)
        shp[k + 1] = int(n)
        val = val + (np.arange(int(n)) * step).reshape(shp)
    return val.reshape(shape)


def iota(*args, **kwargs):
    """Index-dependent values: beta 1 ``iota(expr, dtype)`` with an index-grid expression;
    0.x ``iota(dst, pattern, offset, channel_multiplier=0)``."""
    if args and isinstance(args[0], NkiTensor) or "dst" in kwargs:
        kw = dict(kwargs)
        dst = kw.pop("dst") if "dst" in kw else args[0]
        rest = list(args[1:]) if "dst" not in kwargs else list(args)
        names = ["pattern", "offset", "channel_multiplier"]
        for n, a in zip(names, rest):
            kw[n] = a
        if isinstance(kw.get("pattern"), np.ndarray):  # iota(dst, expr)
            vals = kw["pattern"].astype(np.float64)
        else:
            vals = _affine_values(dst.shape, kw["pattern"], kw.get("offset", 0), kw.get("channel_multiplier", 0))
        dst.write(align_to(vals, dst.shape))
        return dst
    kw = dict(kwargs)
    expr = args[0] if args else kw.pop("expr")
    dtype = args[1] if len(args) > 1 else kw.get("dtype", _dt.int32)
    vals = np.asarray(expr, dtype=np.float64)
    return _ops.result(vals.astype(F32), dtype)


def affine_select(*args, **kwargs):
    """Choose on_true_tile where an affine predicate of the indices holds, else on_false_value
    (e.g. causal masks).  Beta 1: ``affine_select(pred, on_true_tile, on_false_value)`` with
    ``pred`` an index-grid comparison; 0.x: ``affine_select(dst, pattern, offset,
    channel_multiplier, on_true_tile, on_false_value, cmp_op=nl.equal)``."""
    if (args and isinstance(args[0], NkiTensor)) or "dst" in kwargs:
        kw = dict(kwargs)
        if "dst" in kw:
            dst, rest = kw.pop("dst"), list(args)
        else:
            dst, rest = args[0], list(args[1:])
        for n, a in zip(["pattern", "offset", "channel_multiplier", "on_true_tile", "on_false_value", "cmp_op"], rest):
            kw[n] = a
        vals = _affine_values(dst.shape, kw["pattern"], kw.get("offset", 0), kw.get("channel_multiplier", 0))
        cmp = _ops.resolve_binary(kw.get("cmp_op", np.equal))
        pred = cmp(vals, 0)
        v, _ = _values(kw["on_true_tile"], "nisa.affine_select")
        r = np.where(pred, align_to(v, dst.shape), F32(kw["on_false_value"]))
        dst.write(r)
        return dst
    kw = dict(kwargs)
    names = ["pred", "on_true_tile", "on_false_value"]
    for n, a in zip(names, args):
        kw[n] = a
    v, d = _values(kw["on_true_tile"], "nisa.affine_select")
    pred = align_to(np.asarray(kw["pred"], dtype=bool), v.shape)
    r = np.where(pred, v, F32(kw["on_false_value"]))
    return _ops.result(r, kw.get("dtype") or d, kw.get("mask"))


def memset(*args, **kwargs):
    """Fill with a constant: 0.x ``memset(dst, value)``; beta 1 ``memset(shape, value, dtype)``."""
    kw = dict(kwargs)
    if (args and isinstance(args[0], NkiTensor)) or "dst" in kw:
        dst = kw.pop("dst") if "dst" in kw else args[0]
        rest = list(args[1:]) if "dst" not in kwargs else list(args)
        value = rest[0] if rest else kw["value"]
        if not dst.buffer.on_chip:
            raise NKITypeError("nisa.memset writes SBUF or PSUM")
        dst.write(np.full(dst.shape, value, dtype=np.float64).astype(F32) if _dt.is_float(dst.dtype)
                  else np.full(dst.shape, value))
        return dst
    shape = args[0] if args else kw.pop("shape")
    value = args[1] if len(args) > 1 else kw.pop("value")
    dtype = args[2] if len(args) > 2 else kw.pop("dtype", _dt.float32)
    shape = tuple(shape)
    return _ops.result(np.full(shape, value, dtype=F32), dtype)


def dropout(*args, **kwargs):
    """Zero elements with probability ``prob``."""
    dst, kw = _style(args, kwargs, [("data", "T"), ("prob", "A")])
    v, d = _values(kw["data"], "nisa.dropout")
    p, _ = _values(kw["prob"], "prob")
    keep = current().rng.random(v.shape, dtype=F32) >= align_to(p, v.shape)
    return _emit(dst, np.where(keep, v, F32(0)), kw.get("dtype") or d, name="dropout")


# ---------------------------------------------------------------- bn stats
def bn_stats(*args, **kwargs):
    """Per partition: (count, mean, variance*count) of the even and of the odd elements."""
    dst, kw = _style(args, kwargs, [("data", "T")])
    v, d = _values(kw["data"], "nisa.bn_stats")
    v = v.reshape(v.shape[0], -1)
    if v.shape[1] > TileSize.bn_stats_fmax:
        raise NKILimitError("nl.tile_size.bn_stats_fmax", v.shape[1], TileSize.bn_stats_fmax,
                            "bn_stats input free size")
    return _emit(dst, bn_stats_of(v), kw.get("dtype") or d, name="bn_stats")


def bn_stats_of(v: np.ndarray) -> np.ndarray:
    """(count, mean, var*count) of the even and of the odd elements of each row
    of a 2-D array: what bn_stats computes (shared with trace lowering)."""
    out = np.zeros((v.shape[0], 6), dtype=F32)
    for j, part in enumerate((v[:, 0::2], v[:, 1::2])):
        n = part.shape[1]
        out[:, 3 * j] = n
        if n:
            m = part.mean(axis=1, dtype=F32)
            out[:, 3 * j + 1] = m
            out[:, 3 * j + 2] = ((part - m[:, None]) ** 2).sum(axis=1, dtype=F32)
    return out


def bn_aggr(*args, **kwargs):
    """Combine bn_stats tuples into (mean, variance) per partition."""
    dst, kw = _style(args, kwargs, [("data", "T")])
    v, d = _values(kw["data"], "nisa.bn_aggr")
    v = v.reshape(v.shape[0], -1)
    if v.shape[1] % 3:
        raise NKITypeError("nisa.bn_aggr input must hold (count, mean, var*count) triples")
    return _emit(dst, bn_aggr_of(v), kw.get("dtype") or d, name="bn_aggr")


def bn_aggr_of(v: np.ndarray) -> np.ndarray:
    """(mean, variance) per row from rows of bn_stats triples (shared with trace lowering)."""
    t = v.reshape(v.shape[0], -1, 3).astype(np.float64)
    cnt, mean_i, m2 = t[..., 0], t[..., 1], t[..., 2]
    n = cnt.sum(axis=1)
    safe = np.where(n > 0, n, 1)
    mean = (cnt * mean_i).sum(axis=1) / safe
    var = (m2 + cnt * (mean_i - mean[:, None]) ** 2).sum(axis=1) / safe
    return np.stack([mean, var], axis=1).astype(F32)


# -------------------------------------------------------------------- DMA
def dma_copy(*args, **kwargs):
    """Move data between any memories (HBM<->SBUF, HBM->HBM, SBUF->SBUF).

    DMA moves bits; if the dtypes differ the value is converted (rounded to
    nearest-even).  ``dst_rmw_op=np.add`` accumulates into dst instead.
    """
    kw = dict(kwargs)
    names = ["dst", "src"]
    for n, a in zip(names, args):
        kw[n] = a
    dst, src = _tile(kw["dst"], "dma_copy dst"), _tile(kw["src"], "dma_copy src")
    mask = _mask(kw.get("mask"), dst.shape)
    src_mask = None
    if kw.get("oob_mode") is oob_mode.skip:
        # elements of an indirect view outside its tensor are not transferred
        if src._oob is not None:
            src_mask = ~src._oob
            keep = align_to(src_mask, dst.shape)
            mask = keep if mask is None else mask & keep
        if dst._oob is not None:
            mask = ~dst._oob if mask is None else mask & ~dst._oob
    vals = src.raw_values(src_mask, "nisa.dma_copy (source)")
    if src.dtype != dst.dtype:
        vals = _dt.to_compute(vals)
    vals = align_to(vals, dst.shape)
    rmw = kw.get("dst_rmw_op")
    if rmw is not None:
        cur = dst.compute_values(mask, "nisa.dma_copy (destination)")
        vals = _ops.resolve_binary(rmw)(cur, _dt.to_compute(np.asarray(vals))).astype(F32)
    dst.write(vals, mask, what="nisa.dma_copy (destination)")
    return dst


def dma_compute(*args, **kwargs):
    """``dst = reduce_op(srcs[0] * scales[0], srcs[1] * scales[1], ...)`` in the DMA engines: each
    source converted to float32, the sum rounded once to ``dst``'s dtype.  ``reduce_op`` is
    ``nl.add`` and every scale 1.0 (None means all 1.0), as on the device.  A destination that is
    also a source with a ``vector_offset`` is a read-modify-write scatter; its indices must be unique
    (``unique_indices=True``)."""
    kw = dict(kwargs)
    names = ["dst", "srcs"]
    if len(args) > 2 and isinstance(args[2], (list, tuple)):
        names += ["scales", "reduce_op"]  # the older order: dst, srcs, scales, reduce_op
    else:
        names += ["reduce_op", "scales"]
    for n, a in zip(names, args):
        if n in kw:
            raise TypeError(f"nisa.dma_compute: argument {n!r} given twice")
        kw[n] = a
    dst = _tile(kw.get("dst"), "dma_compute dst")
    srcs = list(kw.get("srcs") or ())
    if not srcs:
        raise NKITypeError("nisa.dma_compute: srcs must list at least one tensor")
    op = kw.get("reduce_op")
    if _ops.resolve_binary(op) is not np.add:
        raise NKITypeError(f"nisa.dma_compute: reduce_op must be nl.add, got {getattr(op, '__name__', op)!r}")
    scales = kw.get("scales")
    if scales is not None and (len(scales) != len(srcs) or any(float(x) != 1.0 for x in scales)):
        raise NKITypeError(f"nisa.dma_compute: scales must be 1.0 for each of the {len(srcs)} sources, got {scales}")
    total = None
    for i, src in enumerate(srcs):
        v = _dt.to_compute(_tile(src, f"dma_compute srcs[{i}]").raw_values(None, f"nisa.dma_compute (srcs[{i}])"))
        v = align_to(v, dst.shape)
        total = v.astype(F32) if total is None else (total + v).astype(F32)
    key = getattr(dst, "_key", None)
    if key is not None and kw.get("unique_indices", True) is False and np.unique(key).size != key.size:
        raise NKITypeError("nisa.dma_compute: repeated destination indices with unique_indices=False are not "
                           "supported by the emulator")
    dst.write(total, what="nisa.dma_compute (destination)")
    return dst


def dma_transpose(*args, **kwargs):
    """Transpose while moving (2-D swap, or ``axes`` permutation)."""
    kw = dict(kwargs)
    if len(args) >= 2 or "dst" in kw:
        dst = kw.pop("dst") if "dst" in kw else args[0]
        src = args[1] if "dst" not in kwargs and len(args) > 1 else kw.pop("src", args[0] if args else None)
    else:
        dst, src = None, args[0] if args else kw.pop("src")
    src = _tile(src, "dma_transpose src")
    vals = src.raw_values(None, "nisa.dma_transpose")
    axes = kw.get("axes")
    out = np.ascontiguousarray(np.transpose(vals, axes) if axes is not None else vals.T)
    if dst is None:
        t = allocate(out.shape, src.dtype, Buffer.sbuf, "dma_transpose")
        t.write(out)
        return t
    dst.write(align_to(out, dst.shape))
    return dst


def range_select(*args, **kwargs):
    """Keep the elements of ``on_true_tile`` whose free index plus ``range_start`` satisfies
    ``comp_op0(i, bound0)`` and ``comp_op1(i, bound1)`` (bounds: one value per partition), put
    ``on_false_value`` elsewhere (Vector Engine, NeuronCore-v3 and newer).  With ``reduce_res``
    the results are also reduced along the free axes with ``reduce_op`` (``reduce_cmd`` as for
    ``tensor_scalar_reduce``)."""
    kw = dict(kwargs)
    for n, a in zip(["dst", "on_true_tile", "comp_op0", "comp_op1", "bound0", "bound1"], args):
        if n in kw:
            raise TypeError(f"nisa.range_select: argument {n!r} given twice")
        kw[n] = a
    if current().launch.target.generation < 3:
        raise NKITypeError("nisa.range_select needs NeuronCore-v3 or newer")
    v, d = _values(_tile(kw.get("on_true_tile"), "range_select on_true_tile"), "nisa.range_select")
    flat = v.reshape(v.shape[0], -1)
    index = np.arange(flat.shape[1], dtype=F32)[None, :] + F32(kw.get("range_start", 0.0))
    keep = np.ones(flat.shape, dtype=bool)
    for op_name, bound_name in (("comp_op0", "bound0"), ("comp_op1", "bound1")):
        b, _ = _values(kw.get(bound_name), bound_name)
        b = np.asarray(b, dtype=F32)
        b = b.reshape(-1, 1) if b.ndim else b
        keep &= np.asarray(_ops.resolve_binary(kw.get(op_name))(index, b), dtype=bool)
    out = np.where(keep, flat, F32(kw.get("on_false_value", 0.0))).astype(F32)
    reduce_res = kw.get("reduce_res")
    if reduce_res is not None:
        op = kw.get("reduce_op", np.maximum)
        partial = _free_reduce(op, out)
        cmd = kw.get("reduce_cmd", reduce_cmd.idle)
        reg = _accumulate(engine.vector, op, partial.astype(F32),
                          reduce_cmd.reset_reduce if cmd is reduce_cmd.idle else cmd)
        _write_reduce_res(reduce_res, reg)
    dst = kw.get("dst")
    return _emit(dst, out.reshape(v.shape), (dst.dtype if dst is not None else d), name="range_select")


# ------------------------------------------------- cross-partition movement
QUADRANT = 32
SHUFFLE_KEEP = 255  # a shuffle_mask entry that leaves its destination partition unmodified


def nc_stream_shuffle(*args, **kwargs):
    """Move partitions within each quadrant of 32 (Vector Engine): partition ``q*32 + i`` of ``dst``
    receives partition ``q*32 + shuffle_mask[i]`` of ``src``, the same mask in every quadrant; an entry
    of 255 leaves that destination partition unmodified.  ``nc_stream_shuffle(dst, src, shuffle_mask)``;
    ``dst`` may be ``src`` (the source is read before anything is written).  The bits move unchanged,
    so both tiles have one dtype and the same number of elements per partition."""
    kw = dict(kwargs)
    for n, a in zip(["dst", "src", "shuffle_mask"], args):
        if n in kw:
            raise TypeError(f"nisa.nc_stream_shuffle: argument {n!r} given twice")
        kw[n] = a
    dst, src = _tile(kw.get("dst"), "nc_stream_shuffle dst"), _tile(kw.get("src"), "nc_stream_shuffle src")
    mask = [int(m) for m in kw.get("shuffle_mask", ())]
    if len(mask) != QUADRANT or any(not (0 <= m < QUADRANT or m == SHUFFLE_KEEP) for m in mask):
        raise NKITypeError(f"nisa.nc_stream_shuffle: shuffle_mask must list {QUADRANT} source partitions "
                           f"(0..{QUADRANT - 1}, or {SHUFFLE_KEEP} to keep the destination's), got {mask}")
    for t, what in ((dst, "dst"), (src, "src")):
        if not t.buffer.on_chip:
            raise NKITypeError(f"nisa.nc_stream_shuffle: {what} must be in SBUF or PSUM, not {t.buffer.value}")
    if _dt.name(dst.dtype) != _dt.name(src.dtype):
        raise NKITypeError(f"nisa.nc_stream_shuffle: dst ({_dt.name(dst.dtype)}) and src "
                           f"({_dt.name(src.dtype)}) must have the same dtype")
    per_partition = int(np.prod(dst.shape[1:], dtype=np.int64))
    if per_partition != int(np.prod(src.shape[1:], dtype=np.int64)):
        raise NKITypeError(f"nisa.nc_stream_shuffle: dst {tuple(dst.shape)} and src {tuple(src.shape)} must "
                           f"have the same number of elements per partition")
    vals = src.raw_values(None, "nisa.nc_stream_shuffle (source)").reshape(src.shape[0], -1)
    rows = np.arange(dst.shape[0])
    picked = np.asarray(mask)[rows % QUADRANT]
    keep = picked == SHUFFLE_KEEP
    source_rows = (rows // QUADRANT) * QUADRANT + np.where(keep, 0, picked)
    if (~keep & (source_rows >= src.shape[0])).any():
        bad = int(source_rows[~keep & (source_rows >= src.shape[0])][0])
        raise NKIOutOfBoundsError(f"nisa.nc_stream_shuffle: source partition {bad} is outside src, which has "
                                  f"{src.shape[0]} partitions")
    out = vals[np.minimum(source_rows, src.shape[0] - 1)].reshape(dst.shape)
    write_mask = np.broadcast_to((~keep).reshape((-1,) + (1,) * (len(dst.shape) - 1)), dst.shape)
    dst.write(out, None if not keep.any() else write_mask, what="nisa.nc_stream_shuffle (destination)")
    return dst


# -------------------------------------------------------- virtual registers
def register_alloc(x=None):
    """A new virtual register, holding ``x`` (an integer or another register; 0 if None)."""
    return VirtualRegister(0 if x is None else x)


def register_move(dst, src=None, imm=None):
    """Set register ``dst`` to a constant integer or another register's value."""
    _register(dst, "register_move dst").set(src if src is not None else imm)
    return dst


def register_load(dst, src):
    """Load the one 32-bit integer of tile ``src`` (HBM or SBUF) into register ``dst``."""
    reg = _register(dst, "register_load dst")
    t = _tile(src, "register_load src")
    vals = t.raw_values(None, "nisa.register_load")
    if vals.size != 1:
        raise NKITypeError(f"nisa.register_load: src must hold one element, it has {vals.size}")
    rec = _recording()
    if rec is not None:  # control flow may now follow the data
        rec.poison("a register loaded from data (nisa.register_load)")
    reg.set(int(np.asarray(_dt.to_compute(vals)).reshape(-1)[0]))
    return dst


def register_store(dst, src):
    """Write register ``src``'s value into the one-element tile ``dst``."""
    t = _tile(dst, "register_store dst")
    if int(np.prod(t.shape, dtype=np.int64)) != 1:
        raise NKITypeError(f"nisa.register_store: dst must hold one element, it has shape {tuple(t.shape)}")
    t.write(np.full(t.shape, _register(src, "register_store src").value))
    return dst


def _register(r, what):
    if not isinstance(r, VirtualRegister):
        raise NKITypeError(f"{what} must be a register from nisa.register_alloc, got {r!r}")
    return r


# ------------------------------------------- the two cores of a logical core
def _lnc_rank(what):
    pair, rank = _lnc.current_pair()
    if pair is None:
        raise NKITypeError(f"{what} exchanges data between the two cores of a logical NeuronCore: launch the "
                           f"kernel with LNC degree 2 (kernel[2]), not grid {current().launch.grid}")
    if current().launch.target.generation < 3:
        raise NKITypeError(f"{what} needs NeuronCore-v3 or newer, not {current().launch.target.name}")
    rec = _recording()
    if rec is not None:  # what one core reads depends on the other's timing: no recorded program
        rec.poison(f"{what} between the cores of a logical NeuronCore")
    return pair, rank


def sendrecv(*args, **kwargs):
    """Send ``src`` to the ``dst`` of core ``send_to_rank`` while receiving core ``recv_from_rank``'s
    ``src`` into this core's ``dst`` (DMA: the bits move unchanged; both tiles in SBUF, one dtype).
    ``pipe_id``, ``dma_engine`` and ``name`` are accepted; transfers between two cores arrive in the
    order they were sent."""
    kw = dict(kwargs)
    for n, a in zip(["src", "dst", "send_to_rank", "recv_from_rank", "pipe_id"], args):
        if n in kw:
            raise TypeError(f"nisa.sendrecv: argument {n!r} given twice")
        kw[n] = a
    src, dst = _tile(kw.get("src"), "sendrecv src"), _tile(kw.get("dst"), "sendrecv dst")
    for t, what in ((src, "src"), (dst, "dst")):
        if t.buffer is not Buffer.sbuf:
            raise NKITypeError(f"nisa.sendrecv: {what} must be in SBUF, not {t.buffer.value}")
    if _dt.name(src.dtype) != _dt.name(dst.dtype):
        raise NKITypeError(f"nisa.sendrecv: src ({_dt.name(src.dtype)}) and dst ({_dt.name(dst.dtype)}) must "
                           f"have the same dtype")
    to, frm = int(kw.get("send_to_rank", -1)), int(kw.get("recv_from_rank", -1))
    if to not in (0, 1) or frm not in (0, 1):
        raise NKITypeError(f"nisa.sendrecv: send_to_rank and recv_from_rank must be 0 or 1, got {to} and {frm}")
    pair, rank = _lnc_rank("nisa.sendrecv")
    values = src.raw_values(None, "nisa.sendrecv (source)").copy()
    pair.send(rank, to, values)
    got = pair.receive(rank, frm, f"nisa.sendrecv from core {frm}")
    if got.size != int(np.prod(dst.shape, dtype=np.int64)):
        raise NKITypeError(f"nisa.sendrecv: core {frm} sent {got.size} elements into a dst of shape "
                           f"{tuple(dst.shape)}")
    dst.write(got.reshape(dst.shape), what="nisa.sendrecv (destination)")
    return dst


def core_barrier(*args, **kwargs):
    """Wait until both cores of the logical NeuronCore have reached this barrier (their writes to
    ``data``, a shared HBM tensor, before it are then visible to both).  ``cores`` must be (0, 1)."""
    kw = dict(kwargs)
    for n, a in zip(["data", "cores"], args):
        kw[n] = a
    cores = tuple(int(c) for c in kw.get("cores", (0, 1)))
    if cores != (0, 1):
        raise NKITypeError(f"nisa.core_barrier: only cores=(0, 1) is supported, got {cores}")
    _tile(kw.get("data"), "core_barrier data")
    pair, rank = _lnc_rank("nisa.core_barrier")
    pair.barrier(rank, "nisa.core_barrier")
    return None


# ------------------------------------------------------ GpSimd index search
GPSIMD_CORE_PARTITIONS = 16  # each GpSimd core serves 16 partitions and reads/writes the first


def nonzero_with_count(*args, **kwargs):
    """Indices of the nonzero elements of each row, then ``padding_val``, then their count (GpSimd).

    Only partitions 0, 16, 32, ..., 112 are read and written (each GpSimd core uses the
    first of its 16 partitions); the others of ``dst`` keep their values.  ``dst`` has one
    more element per partition than ``src``: ``[indices + index_offset..., padding..., N]``."""
    kw = dict(kwargs)
    for n, a in zip(["dst", "src", "index_offset", "padding_val"], args):
        if n in kw:
            raise TypeError(f"nisa.nonzero_with_count: argument {n!r} given twice")
        kw[n] = a
    dst, src = _tile(kw.get("dst"), "nonzero_with_count dst"), _tile(kw.get("src"), "nonzero_with_count src")
    if current().launch.target.generation < 3:
        raise NKITypeError("nisa.nonzero_with_count needs NeuronCore-v3 or newer")
    v, _ = _values(src, "nisa.nonzero_with_count")
    v = v.reshape(v.shape[0], -1)
    width = v.shape[1]
    if int(np.prod(dst.shape[1:], dtype=np.int64)) != width + 1:
        raise NKITypeError(f"nisa.nonzero_with_count: dst needs {width + 1} elements per partition (src's "
                           f"{width} and the count), it has {int(np.prod(dst.shape[1:], dtype=np.int64))}")
    offset, pad = float(kw.get("index_offset", 0)), float(kw.get("padding_val", -1))
    out = _dt.to_compute(dst.raw_values(None, "nisa.nonzero_with_count (destination)")).reshape(dst.shape[0], -1)
    out = out.astype(F32, copy=True)
    rows = range(0, min(v.shape[0], dst.shape[0]), GPSIMD_CORE_PARTITIONS)
    for p in rows:
        idx = np.flatnonzero(v[p] != 0)
        out[p, :] = pad
        out[p, :idx.size] = idx + offset
        out[p, width] = idx.size
    keep = np.zeros(dst.shape[0], dtype=bool)
    keep[list(rows)] = True
    dst.write(out.reshape(dst.shape), np.broadcast_to(keep.reshape((-1,) + (1,) * (len(dst.shape) - 1)), dst.shape),
              what="nisa.nonzero_with_count (destination)")
    return dst


# ------------------------------------------------------------ top-8 search
def max8(*args, **kwargs):
    """The 8 largest values of each partition, in descending order."""
    dst, kw = _style(args, kwargs, [("src", "T")])
    v, d = _values(kw["src"], "nisa.max8")
    v = v.reshape(v.shape[0], -1)
    top = -np.sort(-v, axis=1)[:, :8]
    return _emit(dst, top, kw.get("dtype") or d, name="max8")


def nc_find_index8(*args, **kwargs):
    """Index (per partition) of the first occurrence of each of 8 values in ``data``."""
    dst, kw = _style(args, kwargs, [("data", "T"), ("vals", "T")])
    v, _ = _values(kw["data"], "nisa.nc_find_index8")
    vals, _ = _values(kw["vals"], "nisa.nc_find_index8")
    v = v.reshape(v.shape[0], -1)
    vals = vals.reshape(vals.shape[0], -1)[:, :8]
    idx = np.argmax(v[:, None, :] == vals[:, :, None], axis=2).astype(F32)
    return _emit(dst, idx, kw.get("dtype") or _dt.uint32, name="nc_find_index8")


def nc_match_replace8(*args, **kwargs):
    """Replace, in each partition of ``data``, the first occurrence of each of the 8 ``vals`` with
    ``imm`` (Vector Engine) into ``dst``; ``dst_idx`` gets the positions.  The values are taken in
    reverse order (7 down to 0), each matching the first position not matched yet, so repeated
    values pair with ascending positions from the highest slot down.  A value with no match leaves
    its ``dst_idx`` slot unmodified."""
    kw = dict(kwargs)
    for n, a in zip(["dst", "data", "vals", "imm", "dst_idx"], args):
        if n in kw:
            raise TypeError(f"nisa.nc_match_replace8: argument {n!r} given twice")
        kw[n] = a
    v, d = _values(_tile(kw.get("data"), "nc_match_replace8 data"), "nisa.nc_match_replace8")
    vals, _ = _values(_tile(kw.get("vals"), "nc_match_replace8 vals"), "nisa.nc_match_replace8")
    flat = v.reshape(v.shape[0], -1).astype(F32, copy=True)
    vals = vals.reshape(vals.shape[0], -1)
    if vals.shape[1] < 8:
        raise NKITypeError(f"nisa.nc_match_replace8: vals needs 8 values per partition, it has {vals.shape[1]}")
    imm = F32(kw.get("imm"))
    dst_idx = kw.get("dst_idx")
    idx = None
    if dst_idx is not None:
        idx = _dt.to_compute(_tile(dst_idx, "nc_match_replace8 dst_idx").raw_values(None, "dst_idx")
                             ).reshape(flat.shape[0], -1).astype(F32, copy=True)
    matched = np.zeros(flat.shape, dtype=bool)
    for i in range(7, -1, -1):
        hit = (flat == vals[:, i:i + 1]) & ~matched
        found = hit.any(axis=1)
        pos = np.argmax(hit, axis=1)
        rows = np.flatnonzero(found)
        matched[rows, pos[rows]] = True
        if idx is not None:
            idx[rows, i] = pos[rows]
    flat[matched] = imm
    if idx is not None:
        dst_idx.write(idx.reshape(dst_idx.shape), what="nisa.nc_match_replace8 (dst_idx)")
    return _emit(kw.get("dst"), flat.reshape(v.shape), kw.get("dtype") or d, name="nc_match_replace8")


def nc_n_gather(*args, **kwargs):
    """``dst[p, ...] = data[p].flatten()[indices[p, ...]]`` within each partition (GpSimd Engine; the
    bits move unchanged).  ``indices`` are uint32 and give ``dst``'s shape."""
    kw = dict(kwargs)
    for n, a in zip(["dst", "data", "indices"], args):
        if n in kw:
            raise TypeError(f"nisa.nc_n_gather: argument {n!r} given twice")
        kw[n] = a
    dst = _tile(kw.get("dst"), "nc_n_gather dst")
    data = _tile(kw.get("data"), "nc_n_gather data")
    ind = _tile(kw.get("indices"), "nc_n_gather indices")
    for t, what in ((dst, "dst"), (data, "data"), (ind, "indices")):
        if t.buffer is not Buffer.sbuf:
            raise NKITypeError(f"nisa.nc_n_gather: {what} must be in SBUF, not {t.buffer.value}")
    if _dt.name(dst.dtype) != _dt.name(data.dtype):
        raise NKITypeError(f"nisa.nc_n_gather: dst ({_dt.name(dst.dtype)}) must have data's dtype "
                           f"({_dt.name(data.dtype)})")
    flat = data.raw_values(None, "nisa.nc_n_gather (data)").reshape(data.shape[0], -1)
    i = np.asarray(ind.raw_values(None, "nisa.nc_n_gather (indices)")).astype(np.int64).reshape(ind.shape[0], -1)
    if i.size and (i.min() < 0 or i.max() >= flat.shape[1]):
        raise NKIOutOfBoundsError(f"nisa.nc_n_gather: indices outside the {flat.shape[1]} elements of a partition")
    dst.write(np.take_along_axis(flat, i, axis=1).reshape(dst.shape), what="nisa.nc_n_gather (destination)")
    return dst


GPSIMD_PARTITIONS = 16  # partitions each of the GpSimd Engine's eight cores reads and writes
LOCAL_GATHER_RUNS = (1, 2, 4, 8, 16, 32)
LOCAL_GATHER_MAX_INDICES = 4096


def local_gather(*args, **kwargs):
    """Gather within each GpSimd core's 16 partitions: the core's ``index`` entries, read partition by
    partition down each column (the first ``num_valid_indices`` of them), are element offsets into the
    flattened free axes of ``src_buffer``; every partition p of the core gets, for each offset o in turn,
    ``src_buffer[p].flatten()[o : o + num_elem_per_idx]``.  The bits move unchanged (``dst`` has the
    source's dtype) and ``index`` is uint16; an offset past the partition raises."""
    dst, kw = _style(args, kwargs, [("src_buffer", "T"), ("index", "T"), ("num_elem_per_idx", "A"),
                                    ("num_valid_indices", "A")])
    what = "nisa.local_gather"
    src, ind = _tile(kw.get("src_buffer"), f"{what} src_buffer"), _tile(kw.get("index"), f"{what} index")
    for t, name in ((src, "src_buffer"), (ind, "index")) + (((dst, "dst"),) if dst is not None else ()):
        if t.buffer is not Buffer.sbuf:
            raise NKITypeError(f"{what}: {name} must be in SBUF, not {t.buffer.value}")
    if _dt.name(ind.dtype) != "uint16":
        raise NKITypeError(f"{what}: index must be uint16, got {_dt.name(ind.dtype)}")
    p = src.shape[0]
    if ind.shape[0] != p or p % GPSIMD_PARTITIONS:
        raise NKITypeError(f"{what}: src_buffer and index must have the same partition count, a multiple of "
                           f"{GPSIMD_PARTITIONS}; got {tuple(src.shape)} and {tuple(ind.shape)}")
    run = int(kw.get("num_elem_per_idx", 1) or 1)
    if run not in LOCAL_GATHER_RUNS:
        raise NKITypeError(f"{what}: num_elem_per_idx must be one of {LOCAL_GATHER_RUNS}, got {run}")
    per_core = ind.size // (p // GPSIMD_PARTITIONS)
    valid = kw.get("num_valid_indices")
    valid = per_core if valid is None else int(valid)
    if not 0 < valid <= min(per_core, LOCAL_GATHER_MAX_INDICES):
        raise NKITypeError(f"{what}: num_valid_indices must be 1..{min(per_core, LOCAL_GATHER_MAX_INDICES)} "
                           f"(the indices of a core's {GPSIMD_PARTITIONS} partitions, at most "
                           f"{LOCAL_GATHER_MAX_INDICES}), got {valid}")
    flat = src.raw_values(None, f"{what} (src_buffer)").reshape(p, -1)
    idx = np.asarray(ind.raw_values(None, f"{what} (index)")).astype(np.int64).reshape(p, -1)
    # per core: its index block read down the columns, partition first
    offsets = idx.reshape(p // GPSIMD_PARTITIONS, GPSIMD_PARTITIONS, -1).transpose(0, 2, 1).reshape(
        p // GPSIMD_PARTITIONS, -1)[:, :valid]
    if offsets.max() + run > flat.shape[1]:
        raise NKIOutOfBoundsError(f"{what}: an index reads past the {flat.shape[1]} elements of a partition "
                                  f"(largest index {int(offsets.max())}, {run} element(s) each)")
    cols = (offsets[:, :, None] + np.arange(run)).reshape(p // GPSIMD_PARTITIONS, 1, -1)
    cols = np.broadcast_to(cols, (p // GPSIMD_PARTITIONS, GPSIMD_PARTITIONS, valid * run)).reshape(p, -1)
    out = np.take_along_axis(flat, cols, axis=1)
    if dst is None:
        return _emit(None, out.reshape(p, valid, run), src.dtype, name="local_gather")
    if _dt.name(dst.dtype) != _dt.name(src.dtype):
        raise NKITypeError(f"{what}: dst ({_dt.name(dst.dtype)}) must have src_buffer's dtype "
                           f"({_dt.name(src.dtype)}): the gather does not convert")
    if dst.shape[0] != p or dst.size != out.size:
        raise NKITypeError(f"{what}: dst {tuple(dst.shape)} must hold {p} partitions of {valid * run} elements")
    dst.write(out.reshape(dst.shape), what=f"{what} (destination)")
    return dst


# Every instruction is one step of a recorded trace (see trace.py).
instructions(globals(), __name__, exclude={"get_nc_version", "get_nc_sub_version"})
