"""Lowerings of the Vector and Scalar Engines' instructions: ``tensor_tensor``, ``tensor_scalar``,
``tensor_scalar_reduce``, ``scalar_tensor_tensor``, ``tensor_tensor_scan``, ``range_select``,
``tensor_reduce``, ``activation``, ``activation_reduce``, ``nc_find_index8``, ``tensor_copy``,
``nc_transpose``, ``nc_stream_shuffle``, ``affine_select``, ``max8``, ``reciprocal``, ``bn_stats``,
``bn_aggr``."""
from __future__ import annotations

import numpy as np

from .. import isa as _isa
from .. import ops as _ops
from ..errors import NKIError
from ..tensor import align_to
from ..trace import View, _Nested
from .lowerer import Decline, binary_op, emit, lowering, style

F32 = np.float32
_errstate = np.errstate


@lowering(_isa.tensor_tensor)
def _tensor_tensor(lw, step):
    dst, kw = style(step, [("data1", "T"), ("data2", "T"), ("op", "F")])
    a, b = kw["data1"], kw["data2"]
    if not isinstance(a, View) or not isinstance(b, View):
        raise Decline("tensor_tensor")
    f = _ops.resolve_binary(kw["op"])
    ga, _, _ = lw.value(a)
    gb, _, _ = lw.value(b)
    sa, sb = tuple(lw.shape(a)), tuple(lw.shape(b))
    shape = _ops.out_shape(np.empty(sa, np.bool_), np.empty(sb, np.bool_))
    return binary_op(ga, gb, sa != shape, sb != shape, shape, f, emit(lw, step, dst))


@lowering(_isa.tensor_copy)
def _tensor_copy(lw, step):
    dst, kw = style(step, [("src", "T")])
    src = kw["src"]
    g, d, may_alias = lw.value(src)
    put = emit(lw, step, dst, src.slot if may_alias else None)

    def op(V, X, L):
        put(V, X, g(V, X))
    return op


@lowering(_isa.affine_select)
def _affine_select(lw, step):
    kw = dict(step.kwargs)
    if (step.args and isinstance(step.args[0], View)) or "dst" in kw:
        # 0.x: affine_select(dst, pattern, offset, channel_multiplier, on_true_tile, on_false_value, cmp_op)
        args = list(step.args)
        dst = kw.pop("dst") if "dst" in kw else args.pop(0)
        kw.update(zip(["pattern", "offset", "channel_multiplier", "on_true_tile", "on_false_value", "cmp_op"], args))
        if not isinstance(dst, View) or isinstance(kw.get("pattern"), (View, _Nested)):
            raise Decline("affine_select")
        shape = tuple(lw.shape(dst))
        # the predicate depends on indices only: made once, as the interpreter makes it
        vals = _isa._affine_values(shape, kw["pattern"], kw.get("offset", 0), kw.get("channel_multiplier", 0))
        pred = _ops.resolve_binary(kw.get("cmp_op", np.equal))(vals, 0)
        g, _, _ = lw.value(kw["on_true_tile"])
        fv = F32(kw["on_false_value"])
        w = lw.writer(dst)

        def op(V, X, L):
            w(V, np.where(pred, align_to(g(V, X), shape), fv))
        return op
    for n, a in zip(["pred", "on_true_tile", "on_false_value"], step.args):
        kw[n] = a
    if kw.get("mask") is not None or isinstance(kw["pred"], (View, _Nested)):
        raise Decline("affine_select")
    t = kw["on_true_tile"]
    g, d, _ = lw.value(t)
    pred = align_to(np.asarray(kw["pred"], dtype=bool), tuple(lw.shape(t)))
    fv = F32(kw["on_false_value"])
    put = lw.produce(step)

    def op(V, X, L):
        put(V, X, np.where(pred, g(V, X), fv))
    return op


@lowering(_isa.tensor_reduce)
def _tensor_reduce(lw, step):
    dst, kw = style(step, [("op", "F"), ("data", "T"), ("axis", "A")])
    data = kw["data"]
    g, d, _ = lw.value(data)
    ndim = len(lw.shape(data))
    axes = _ops.normalize_axis(kw.get("axis"), ndim)
    f = _ops.resolve_binary(kw["op"])
    if not isinstance(f, np.ufunc):
        raise Decline("reduction op")
    keepdims, negate = kw.get("keepdims", False), kw.get("negate", False)
    put = emit(lw, step, dst)

    def op(V, X, L):
        with _errstate(all="ignore"):
            r = f.reduce(g(V, X), axis=axes, keepdims=keepdims)
        if negate:
            r = -r
        put(V, X, np.asarray(r, dtype=F32))
    return op


@lowering(_isa.activation)
def _activation(lw, step):
    dst, kw = style(step, [("op", "F"), ("data", "T"), ("bias", "A"), ("scale", "A")])
    return _activation_op(lw, step, dst, kw)


@lowering(_isa.activation_reduce)
def _activation_reduce(lw, step):
    dst, kw = style(step, [("op", "F"), ("data", "T"), ("reduce_op", "F"), ("reduce_res", "T"), ("bias", "A"),
                           ("scale", "A")])
    kw.setdefault("reduce_cmd", _isa.reduce_cmd.reset_reduce)
    return _activation_op(lw, step, dst, kw)


def _activation_op(lw, step, dst, kw):
    f = _ops.resolve_unary(kw["op"])
    data = kw["data"]
    g, d, may_alias = lw.value(data)
    vshape = tuple(lw.shape(data))
    scale = kw.get("scale", 1.0)
    gs = None
    if not (isinstance(scale, (int, float)) and scale == 1.0):
        gs, _, ss = lw.operand(scale)
        s_align = bool(ss)
        may_alias = False
    bias = kw.get("bias")
    gb = None
    if bias is not None:
        gb, _, _ = lw.operand(bias)
        may_alias = False
    reduce_res = kw.get("reduce_res")
    wr = None
    if reduce_res is not None:
        if kw.get("reduce_cmd") not in (None, _isa.reduce_cmd.reset_reduce):
            raise Decline("accumulation register")
        rop = kw.get("reduce_op")
        rf = _ops.resolve_binary(rop if rop is not None else np.add)
        if not isinstance(rf, np.ufunc):
            raise Decline("reduction op")
        rshape = tuple(lw.shape(reduce_res))
        wr = lw.writer(reduce_res)
    if f is not _ops.UNARY["copy"] and f is not _ops.UNARY["identity"]:
        may_alias = False
    put = emit(lw, step, dst, data.slot if may_alias else None)

    def op(V, X, L):
        x = g(V, X)
        if gs is not None:
            s = gs(V, X)
            x = x * (align_to(s, vshape) if s_align else s)
        if gb is not None:
            x = x + align_to(gb(V, X), vshape)
        with _errstate(all="ignore"):
            out = np.asarray(f(x.astype(F32, copy=False)), dtype=F32)
        if wr is not None:
            partial = rf.reduce(out, axis=tuple(range(1, out.ndim)), keepdims=True).reshape(out.shape[0], 1)
            wr(V, align_to(partial, rshape))
        put(V, X, out)
    return op


def _stage(lw, op, operand, reverse):
    """isa ``_apply``: a closure s(V, X, r) -> ``r op operand`` (or ``operand op r``); a unary ``op``
    applies to ``r`` (the recording checked that its operand is the neutral 0)."""
    try:
        f = _ops.resolve_binary(op)
    except NKIError:
        g = _ops.resolve_unary(op)

        def unary(V, X, r):
            with _errstate(all="ignore"):
                return np.asarray(g(r), dtype=F32)
        return unary
    go, _, so = lw.operand(operand)
    align, reverse = bool(so), bool(reverse)

    def binary(V, X, r):
        o = go(V, X)
        if align:
            o = align_to(o, r.shape)
        with _errstate(all="ignore"):
            return np.asarray(f(o, r) if reverse else f(r, o), dtype=F32)
    return binary


@lowering(_isa.tensor_scalar)
def _tensor_scalar(lw, step):
    dst, kw = style(step, [("data", "T"), ("op0", "F"), ("operand0", "A"), ("reverse0", "A"),
                           ("op1", "F"), ("operand1", "A"), ("reverse1", "A")])
    g, d, _ = lw.value(kw["data"])
    if kw.get("op0") is None:
        raise Decline("tensor_scalar")
    stages = [_stage(lw, kw["op" + i], kw.get("operand" + i), kw.get("reverse" + i, False))
              for i in ("0", "1") if i == "0" or kw.get("op1") is not None]
    put = emit(lw, step, dst)

    def op(V, X, L):
        r = g(V, X)
        for stage in stages:
            r = stage(V, X, r)
        put(V, X, r)
    return op


def _reduce_writer(lw, reduce_res, reduce_op, cmd, idle=None):
    """The write of a free-axis reduction into ``reduce_res`` (a reset accumulation register,
    as isa ``_accumulate`` keeps it): w(V, values)."""
    if cmd not in (None, idle, _isa.reduce_cmd.reset_reduce):
        raise Decline("accumulation register")
    rf = _ops.resolve_binary(reduce_op)
    if not isinstance(rf, np.ufunc):
        raise Decline("reduction op")
    rshape = tuple(lw.shape(reduce_res))
    w = lw.writer(reduce_res)

    def write(V, out):
        partial = rf.reduce(out, axis=tuple(range(1, out.ndim)), keepdims=True).reshape(out.shape[0], 1)
        w(V, align_to(partial.astype(F32), rshape))
    return write


@lowering(_isa.tensor_scalar_reduce)
def _tensor_scalar_reduce(lw, step):
    dst, kw = style(step, [("data", "T"), ("op0", "F"), ("operand0", "A"), ("reduce_op", "F"),
                           ("reduce_res", "T"), ("reverse0", "A")])
    g, _, _ = lw.value(kw["data"])
    stage = _stage(lw, kw["op0"], kw.get("operand0"), kw.get("reverse0", False))
    wr = _reduce_writer(lw, kw["reduce_res"], kw["reduce_op"], None)
    put = emit(lw, step, dst)

    def op(V, X, L):
        r = stage(V, X, g(V, X))
        wr(V, r)
        put(V, X, r)
    return op


@lowering(_isa.range_select)
def _range_select(lw, step):
    kw = dict(step.kwargs)
    for n, a in zip(["dst", "on_true_tile", "comp_op0", "comp_op1", "bound0", "bound1"], step.args):
        kw[n] = a
    t = kw.get("on_true_tile")
    if not isinstance(t, View):
        raise Decline("range_select")
    g, _, _ = lw.value(t)
    shape = tuple(lw.shape(t))
    flat_shape = (shape[0], int(np.prod(shape[1:], dtype=np.int64)))
    index = np.arange(flat_shape[1], dtype=F32)[None, :] + F32(kw.get("range_start", 0.0))
    bounds = [(lw.operand(kw.get(b))[0], _ops.resolve_binary(kw.get(c)))
              for c, b in (("comp_op0", "bound0"), ("comp_op1", "bound1"))]
    fv = F32(kw.get("on_false_value", 0.0))
    wr = None
    if kw.get("reduce_res") is not None:
        wr = _reduce_writer(lw, kw["reduce_res"], kw.get("reduce_op", np.maximum),
                            kw.get("reduce_cmd", _isa.reduce_cmd.idle), _isa.reduce_cmd.idle)
    put = emit(lw, step, kw.get("dst"))

    def op(V, X, L):
        flat = g(V, X).reshape(flat_shape)
        keep = np.ones(flat_shape, dtype=bool)
        for gb, cmp in bounds:
            b = np.asarray(gb(V, X), dtype=F32)
            keep &= np.asarray(cmp(index, b.reshape(-1, 1) if b.ndim else b), dtype=bool)
        out = np.where(keep, flat, fv).astype(F32)
        if wr is not None:
            wr(V, out)
        put(V, X, out.reshape(shape))
    return op


@lowering(_isa.scalar_tensor_tensor)
def _scalar_tensor_tensor(lw, step):
    dst, kw = style(step, [("data", "T"), ("op0", "F"), ("operand0", "A"), ("op1", "F"),
                            ("operand1", "T"), ("reverse0", "A"), ("reverse1", "A")])
    g, _, _ = lw.value(kw["data"])
    g0, _, s0 = lw.operand(kw["operand0"])
    g1, _, s1 = lw.operand(kw["operand1"])
    try:
        stages = [(_ops.resolve_binary(kw["op0"]), g0, bool(s0), bool(kw.get("reverse0", False))),
                  (_ops.resolve_binary(kw["op1"]), g1, bool(s1), bool(kw.get("reverse1", False)))]
    except NKIError:
        raise Decline("unary operator") from None
    put = emit(lw, step, dst)

    def op(V, X, L):
        r = g(V, X)
        o = [go(V, X) for _, go, _, _ in stages]  # operands are read before computing
        for (f, _, align, rev), o_ in zip(stages, o):
            if align:
                o_ = align_to(o_, r.shape)
            with _errstate(all="ignore"):
                r = np.asarray(f(o_, r) if rev else f(r, o_), dtype=F32)
        put(V, X, r)
    return op


def _per_row(fn, data="data"):
    """The lowering of an instruction that maps each row of its (2-D) data."""
    def lower(lw, step):
        dst, kw = style(step, [(data, "T")])
        g, _, _ = lw.value(kw[data])
        put = emit(lw, step, dst)

        def op(V, X, L):
            v = g(V, X)
            put(V, X, fn(v.reshape(v.shape[0], -1)))
        return op
    return lower


lowering(_isa.bn_stats)(_per_row(_isa.bn_stats_of))
lowering(_isa.bn_aggr)(_per_row(_isa.bn_aggr_of))
lowering(_isa.nc_transpose)(_per_row(lambda v: np.ascontiguousarray(v.T)))
lowering(_isa.max8)(_per_row(lambda v: -np.sort(-v, axis=1)[:, :8], "src"))  # (the 8 largest, descending)


@lowering(_isa.nc_stream_shuffle)
def _nc_stream_shuffle(lw, step):
    kw = dict(step.kwargs)
    for n, a in zip(["dst", "src", "shuffle_mask"], step.args):
        if n in kw:
            raise Decline("arguments")
        kw[n] = a
    dst, src = kw.pop("dst", None), kw.pop("src", None)
    shuffle = [int(m) for m in kw.pop("shuffle_mask", ())]
    if kw or len(step.args) > 3 or not isinstance(dst, View) or not isinstance(src, View):
        raise Decline("nc_stream_shuffle")
    # the partitions each destination partition receives (as the interpreter
    # picks them: the recording checked the mask and the bounds)
    dshape, sshape = tuple(lw.shape(dst)), tuple(lw.shape(src))
    rows = np.arange(dshape[0])
    picked = np.asarray(shuffle)[rows % _isa.QUADRANT]
    keep = picked == _isa.SHUFFLE_KEEP
    source_rows = np.minimum((rows // _isa.QUADRANT) * _isa.QUADRANT + np.where(keep, 0, picked), sshape[0] - 1)
    rg = lw.raw(src)
    w = lw.masked_writer(dst, (~keep).reshape((-1,) + (1,) * (len(dshape) - 1)))

    def op(V, X, L):
        vals = rg(V).reshape(sshape[0], -1)
        w(V, vals[source_rows].reshape(dshape))
    return op


@lowering(_isa.nc_find_index8)
def _nc_find_index8(lw, step):
    dst, kw = style(step, [("data", "T"), ("vals", "T")])
    gd, _, _ = lw.value(kw["data"])
    gv, _, _ = lw.value(kw["vals"])
    put = emit(lw, step, dst)

    def op(V, X, L):
        v, vals = gd(V, X), gv(V, X)
        v = v.reshape(v.shape[0], -1)
        vals = vals.reshape(vals.shape[0], -1)[:, :8]
        put(V, X, np.argmax(v[:, None, :] == vals[:, :, None], axis=2).astype(F32))
    return op


@lowering(_isa.tensor_tensor_scan)
def _tensor_tensor_scan(lw, step):
    dst, kw = style(step, [("data0", "T"), ("data1", "T"), ("initial", "A"), ("op0", "F"), ("op1", "F"),
                           ("reverse0", "A"), ("reverse1", "A")])
    g0, _, _ = lw.value(kw["data0"])
    g1, _, _ = lw.value(kw["data1"])
    gi, _, _ = lw.operand(kw["initial"])
    op0, op1 = _ops.resolve_binary(kw["op0"]), _ops.resolve_binary(kw["op1"])
    rev0, rev1 = kw.get("reverse0", False), kw.get("reverse1", False)
    put = emit(lw, step, dst)

    def op(V, X, L):
        v0, v1 = g0(V, X), g1(V, X)
        a, b = v0.reshape(v0.shape[0], -1), v1.reshape(v1.shape[0], -1)
        prev = np.broadcast_to(np.asarray(gi(V, X), dtype=F32).reshape(-1), (a.shape[0],)).astype(F32)
        out = np.empty_like(a)
        # the recurrence runs along the free axis, one vector step over all partitions at a time
        for i in range(a.shape[1]):
            t = op0(prev, a[:, i]) if rev0 else op0(a[:, i], prev)
            prev = (op1(b[:, i], t) if rev1 else op1(t, b[:, i])).astype(F32)
            out[:, i] = prev
        put(V, X, out.reshape(v0.shape))
    return op


@lowering(_isa.reciprocal)
def _reciprocal(lw, step):
    dst, kw = style(step, [("data", "T")])
    g, _, _ = lw.value(kw["data"])
    put = emit(lw, step, dst)
    one = F32(1)

    def op(V, X, L):
        with _errstate(all="ignore"):
            r = (one / g(V, X)).astype(F32)
        put(V, X, r)
    return op
