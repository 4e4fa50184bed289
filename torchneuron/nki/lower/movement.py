"""Lowerings of data movement: loads, stores, tile assignment, ``dma_copy``, ``dma_compute``,
``dma_transpose``, ``.ap()`` and ``.view(dtype)``."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from .. import isa as _isa
from .. import language as _nl
from ..tensor import NkiTensor as _NkiTensor, align_to, assign as _assign_op
from ..trace import View, _Nested, _WHOLE, _GATHER
from .lowerer import Decline, LazyStore, bound, instruction_of, lowering, single_bind

F32 = np.float32
# an engine reads a loaded (not float32) tile straight from HBM, and the load
# copies the tile only if another step reads it (see the package docstring);
# False: every load copies
FORWARD_LOADS = True


def _load(lw, step, transpose):
    fn = instruction_of(step.fn)
    a = bound(fn, step)
    src = a["src"]
    if not isinstance(src, View) or lw.on_chip(src) or not lw.shape(src):
        raise Decline("load source")
    forward = src.kind != _GATHER and FORWARD_LOADS
    if forward:
        r = lw.vid(src)
        lw.touch_storage(src.slot)
    g = lw.raw(src)
    slot = single_bind(step)
    w = lw.new_preallocated(slot)
    _, dt, _, st = lw.meta[slot]
    same = lw.meta[src.slot][3] == st and dt is not _dt.tfloat32
    from_compute = _dt.from_compute
    if same and st != F32 and not transpose and forward:
        # the copy is made only if a step reads the tile other than by one
        # engine read (or the loaded region changes while the tile is live)
        if tuple(lw.shape(src)) != tuple(lw.meta[slot][0]):
            raise Decline("load shape")
        d = LazyStore()
        lw.fwd[slot] = [r, src.slot, d, False]

        def op(V, X, L):
            if d.store:
                np.copyto(V[w], V[r])
        return op
    if transpose:
        if same:
            def op(V, X, L):
                np.copyto(V[w], g(V).T)
        else:
            def op(V, X, L):
                V[w][...] = from_compute(g(V).T, dt)
    else:
        if tuple(lw.shape(src)) != tuple(lw.meta[slot][0]):
            raise Decline("load shape")
        if same:
            def op(V, X, L):
                np.copyto(V[w], g(V))
        else:
            def op(V, X, L):
                V[w][...] = from_compute(g(V), dt)
    return op


@lowering(_nl.load)
def _lower_load(lw, step):
    op = _load(lw, step, False)
    op.loads = True  # writes only its own new tile (_inert)
    return op


@lowering(_nl.load_transpose2d)
def _lower_load_t(lw, step):
    op = _load(lw, step, True)
    op.loads = True
    return op


def _copy_op(lw, value, dst):
    """The step writing `value`'s elements into `dst` (a store or an assignment)."""
    s = value.slot
    if value.kind == _WHOLE and lw.exact.get(s):
        get = lambda V, X: X[s]  # noqa: E731
    else:
        rg = lw.raw(value)
        get = lambda V, X: rg(V)  # noqa: E731
    w = lw.writer(dst)

    def op(V, X, L):
        w(V, get(V, X))
    return op


@lowering(_nl.store)
def _store(lw, step):
    a = bound(_nl.store, step)
    dst, value = a["dst"], a["value"]
    if (not isinstance(dst, View) or lw.on_chip(dst) or not isinstance(value, View) or not lw.on_chip(value)
            or value.mask is not None):
        raise Decline("store operands")
    return _copy_op(lw, value, dst)


@lowering(_assign_op)
def _assign(lw, step):
    if step.kwargs or len(step.args) != 2:
        raise Decline("assign")
    target, value = step.args
    if (not isinstance(target, View) or not isinstance(value, View) or target is value
            or value.mask is not None):
        raise Decline("assign operands")
    if lw.on_chip(value) != lw.on_chip(target):
        raise Decline("assign across memories")
    return _copy_op(lw, value, target)


@lowering(_isa.dma_copy)
def _dma_copy(lw, step):
    kw = dict(step.kwargs)
    for n, a in zip(["dst", "src"], step.args):
        if n in kw:
            raise Decline("arguments")
        kw[n] = a
    if len(step.args) > 2 or kw.get("mask") is not None or kw.get("dst_rmw_op") is not None:
        raise Decline("dma_copy")
    dst, src = kw["dst"], kw["src"]
    if not isinstance(dst, View) or not isinstance(src, View):
        raise Decline("dma_copy")
    rg = lw.raw(src)
    convert = lw.meta[src.slot][1] != lw.meta[dst.slot][1]
    shape = tuple(lw.shape(dst))
    w = lw.writer(dst)
    to_compute = _dt.to_compute

    def op(V, X, L):
        vals = rg(V)
        if convert:
            vals = to_compute(vals)
        w(V, align_to(vals, shape))
    return op


@lowering(_NkiTensor.ap)
def _ap(lw, step):
    # an access pattern over the same buffer is only a view: later steps
    # record it as one; with dtype= it is a second buffer over the same memory
    if not isinstance(step.args[0], View):
        raise Decline("ap")
    if step.kwargs.get("dtype") is None:
        if step.binds:
            raise Decline("ap")
        return None
    return lw.reinterpret(step, step.args[0], flat=True)


@lowering(_NkiTensor.view)
def _view_dtype(lw, step):
    if len(step.args) != 2 or step.kwargs or not isinstance(step.args[0], View):
        raise Decline("view")
    return lw.reinterpret(step, step.args[0], flat=False)


@lowering(_isa.dma_compute)
def _dma_compute(lw, step):
    kw = dict(step.kwargs)
    names = ["dst", "srcs"] + (["scales", "reduce_op"] if len(step.args) > 2 and isinstance(step.args[2], (list, tuple))
                               else ["reduce_op", "scales"])
    for n, a in zip(names, step.args):
        if n in kw:
            raise Decline("arguments")
        kw[n] = a
    dst, srcs = kw.get("dst"), kw.get("srcs")
    if not isinstance(dst, View) or not isinstance(srcs, _Nested) or srcs.kind is dict \
            or not all(isinstance(x, View) for x in srcs.items):
        raise Decline("dma_compute")
    # (the recording checked reduce_op, scales and the indices)
    getters = [lw.raw(x) for x in srcs.items]
    shape = tuple(lw.shape(dst))
    w = lw.writer(dst)
    to_compute = _dt.to_compute

    def op(V, X, L):
        total = None
        for g in getters:
            v = align_to(to_compute(g(V)), shape)
            total = v.astype(F32) if total is None else (total + v).astype(F32)
        w(V, total)
    return op


@lowering(_isa.dma_transpose)
def _dma_transpose(lw, step):
    kw = dict(step.kwargs)
    if not (len(step.args) >= 2 or "dst" in kw):
        raise Decline("dma_transpose without dst")
    dst = kw.pop("dst") if "dst" in kw else step.args[0]
    src = step.args[1] if "dst" not in step.kwargs and len(step.args) > 1 else kw.pop("src", None)
    axes = kw.pop("axes", None)
    if kw or not isinstance(dst, View) or not isinstance(src, View):
        raise Decline("dma_transpose")
    rg = lw.raw(src)
    shape = tuple(lw.shape(dst))
    w = lw.writer(dst)

    def op(V, X, L):
        vals = rg(V)
        w(V, align_to(np.ascontiguousarray(np.transpose(vals, axes) if axes is not None else vals.T), shape))
    return op
