"""Lowerings of ``nki.language`` arithmetic: elementwise functions, reductions,
tile arithmetic and ``+=`` (which may take a matmul's product into PSUM)."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from .. import language as _nl
from .. import ops as _ops
from ..tensor import align_to
from ..trace import View, _WHOLE, _GATHER
from .lowerer import Decline, binary_op, bound, instruction_of, lowering, _LOWERINGS

F32 = np.float32
_errstate = np.errstate


def _unary_op(lw, step, f, x, dtype):
    g, d, _ = lw.value(x) if isinstance(x, View) else (None, None, None)
    if g is None:
        raise Decline("unary operand")
    put = lw.produce(step)

    def op(V, X, L):
        with _errstate(all="ignore"):
            r = f(g(V, X))
        put(V, X, np.asarray(r).astype(F32))
    return op


@lowering(_ops.unary)
def _lower_unary(lw, step):
    a = bound(_ops.unary, step)
    return _unary_op(lw, step, a["f"], a["x"], a["dtype"])


@lowering(_nl.copy)
def _lower_copy(lw, step):
    a = bound(_nl.copy, step)
    return _unary_op(lw, step, _ops.UNARY["copy"], a["x"], a["dtype"])


def _binary_op(lw, step, f, x, y, dtype):
    if f in _ops.BITWISE:
        raise Decline("bitwise")
    ga, da, sa = lw.operand(x)
    gb, db, sb = lw.operand(y)
    shape = _ops.out_shape(np.empty(sa, np.bool_), np.empty(sb, np.bool_)) if (sa or sb) else ()
    if not shape:
        raise Decline("scalar result")
    aa = bool(sa) and tuple(sa) != tuple(shape)
    ab = bool(sb) and tuple(sb) != tuple(shape)
    return binary_op(ga, gb, aa, ab, shape, f, lw.produce(step))


@lowering(_ops.binary)
def _lower_binary(lw, step):
    a = bound(_ops.binary, step)
    return _binary_op(lw, step, a["f"], a["a"], a["b"], a["dtype"])


@lowering(_ops.update)
def _update(lw, step):
    a = bound(_ops.update, step)
    target, f, other = a["target"], a["f"], a["other"]
    if not isinstance(target, View) or not lw.on_chip(target):
        raise Decline("update target")
    if isinstance(other, View) and other.mask is not None:
        raise Decline("mask")
    tshape = tuple(lw.shape(target))
    _, dt, _, st = lw.meta[target.slot]
    in_place = isinstance(f, np.ufunc) and dt is not _dt.tfloat32 and dt == F32 and target.kind != _GATHER
    p = lw.product
    if (in_place and f is np.add and p is not None and p[0] == lw.step_index - 1 and isinstance(other, View)
            and other.kind == _WHOLE and other.slot == p[1] and other.slot in step.frees and lw.exact.get(other.slot)
            and not lw.cur[other.slot].store and len(tshape) == 2 and tuple(lw.meta[other.slot][0]) == tshape):
        # ``psum += nc_matmul(a, b)`` whose product nothing else reads: the GEMM adds
        # its (rounded) sum into the PSUM tile, as np.add of the product would
        p[2][0] = True
        gemm, held = _ops.tile_gemm, other.slot
        t = lw.vid(target)
        lw.touch_storage(target.slot)
        lw.written(target)

        def op(V, X, L):
            gemm(*X[held], V[t])
        if p[3]:
            op.chain = (t, held)
        return op
    g, _, so = lw.operand(other)
    align = bool(so) and tuple(so) != tshape
    if in_place:
        # update_in_place: straight into float32 storage
        t = lw.vid(target)
        lw.touch_storage(target.slot)
        lw.written(target)  # (marks the PSUM elements valid, as update_in_place does)

        def op(V, X, L):
            v = g(V, X)
            if align:
                v = align_to(v, tshape)
            with _errstate(all="ignore"):
                f(V[t], v, out=V[t])
        return op
    cur, _, _ = lw.value(target)
    w = lw.writer(target)

    def op(V, X, L):
        v = g(V, X)
        c = cur(V, X)
        with _errstate(all="ignore"):
            r = f(c, align_to(v, c.shape) if np.ndim(v) else v)
        w(V, np.asarray(r, dtype=F32))
    return op


def _lang_elementwise(lw, step):
    fn = instruction_of(step.fn)
    a = bound(fn, step)
    if hasattr(fn, "_unary"):
        return _unary_op(lw, step, fn._unary, a["x"], a["dtype"])
    if set(a) >= {"x", "y"}:
        return _binary_op(lw, step, fn._binary, a["x"], a["y"], a["dtype"])
    # reductions: ops.reduce
    x = a["x"]
    if not isinstance(x, View):
        raise Decline("reduction operand")
    g, _, _ = lw.value(x)
    axes = _ops.normalize_axis(a["axis"], len(lw.shape(x)))
    f, keepdims = fn._binary, a["keepdims"]
    if not isinstance(f, np.ufunc):
        raise Decline("reduction op")
    put = lw.produce(step)

    def op(V, X, L):
        with _errstate(all="ignore"):
            r = f.reduce(g(V, X), axis=axes, keepdims=keepdims)
        put(V, X, np.asarray(r).astype(F32))
    return op


for _f in vars(_nl).values():
    raw = instruction_of(_f)
    if callable(_f) and getattr(_f, "_nki_instruction", None) and (hasattr(raw, "_unary") or hasattr(raw, "_binary")):
        _LOWERINGS[raw] = _lang_elementwise
