"""Lowerings of new buffers and of values known when lowering: ``nl.ndarray`` (any memory),
``zeros``, ``ones``, ``full``, ``shared_constant``, ``nisa.memset``, ``nisa.iota``."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from .. import isa as _isa
from .. import language as _nl
from ..machine import Buffer, new_storage, reused_storage
from ..tensor import align_to
from ..trace import View, _Nested
from .lowerer import Decline, bound, instruction_of, lowering, single_bind
from .program import view_of

F32 = np.float32


@lowering(_nl.ndarray)
def _ndarray(lw, step):
    a = bound(_nl.ndarray, step)
    buffer = _nl._buffer(a["buffer"])
    if buffer is Buffer.shared_hbm:
        if not step.binds:
            return None  # a later SPMD instance gets the same tensor
        slot = single_bind(step)
        lw.hbm_slots.add(slot)
        lw.exact[slot] = False
        shape, dt, _, st = lw.meta[slot]
        shape = tuple(shape)
        views = lw.slot_views.setdefault(slot, [])
        # [written, read before whole, then (lower()) whether every element is
        # written before any is read]: then its initial zeros are never seen
        # (not tracked for tensors too large to reuse)
        if np.prod(shape) * st.itemsize > reused_storage.largest:
            cover = [None, True, False]
        else:
            cover = lw.cover[slot] = [np.zeros(shape, np.bool_), False]

        def op(V, X, L):
            alloc = L.hbm_allocator
            if alloc is not None:
                data = alloc(shape, st)
            elif cover[2] and not L.debug:
                data = reused_storage(shape, st)
            else:
                data = new_storage(shape, dt, L.debug)
            X[-1][slot] = data
            for vid, kind, vshape, off, strides in views:
                V[vid] = view_of(data, kind, vshape, off, strides)
        return op
    slot = single_bind(step)
    w = lw.new_preallocated(slot)
    shape, dt, _, _ = lw.meta[slot]
    template = new_storage(tuple(shape), dt, lw.debug)

    def op(V, X, L):
        np.copyto(V[w], template)
    return op


@lowering(_nl.zeros, _nl.ones, _nl.full)
def _full(lw, step):
    fn = instruction_of(step.fn)
    a = bound(fn, step)
    fill = {instruction_of(_nl.zeros): 0, instruction_of(_nl.ones): 1}.get(fn, a.get("fill_value"))
    if isinstance(fill, np.ndarray) or not _nl._buffer(a["buffer"]).on_chip:
        raise Decline("full")
    slot = single_bind(step)
    w = lw.new_preallocated(slot)
    shape, dt, _, st = lw.meta[slot]
    vals = align_to(np.float32(fill), tuple(shape))
    if vals.dtype != st or dt is _dt.tfloat32:
        vals = _dt.from_compute(vals, dt)
    template = np.empty(tuple(shape), st)
    template[...] = vals
    if slot in lw.pv:
        lw.pv[slot][...] = True

    def op(V, X, L):
        np.copyto(V[w], template)
    return op


@lowering(_isa.memset)
def _memset(lw, step):
    kw = dict(step.kwargs)
    if not ((step.args and isinstance(step.args[0], View)) or "dst" in kw):
        # beta 1: memset(shape, value, dtype), a new tile
        names = ["shape", "value", "dtype"]
        kw.update(zip(names, step.args))
        if set(kw) - set(names) or not isinstance(kw.get("value"), (int, float, np.number)):
            raise Decline("memset")
        return _new_tile_of(lw, step, np.full(tuple(kw["shape"]), kw["value"], dtype=F32))
    args = list(step.args)
    dst = kw.pop("dst") if "dst" in kw else args.pop(0)
    kw.update(zip(["value"], args))
    value = kw.pop("value", None)
    if kw or len(args) > 1 or not isinstance(dst, View) or not lw.on_chip(dst) \
            or not isinstance(value, (int, float, np.number)):
        raise Decline("memset")
    shape = tuple(lw.shape(dst))
    _, dt, _, _ = lw.meta[dst.slot]
    # the interpreter's values, made once
    return _write_of(lw, dst, np.full(shape, value, dtype=np.float64).astype(F32) if _dt.is_float(dt)
                     else np.full(shape, value))


@lowering(_isa.iota)
def _iota(lw, step):
    kw = dict(step.kwargs)
    if not ((step.args and isinstance(step.args[0], View)) or "dst" in kw):
        # beta 1: iota(expr, dtype), a new tile of the index expression's values
        expr = step.args[0] if step.args else kw.get("expr")
        if isinstance(expr, View) or isinstance(expr, (list, tuple)) and any(isinstance(e, View) for e in expr):
            raise Decline("iota")
        return _new_tile_of(lw, step, np.asarray(expr, dtype=np.float64).astype(F32))
    args = list(step.args)
    dst = kw.pop("dst") if "dst" in kw else args.pop(0)
    kw.update(zip(["pattern", "offset", "channel_multiplier"], args))
    if not isinstance(dst, View) or not lw.on_chip(dst) or isinstance(kw.get("pattern"), View):
        raise Decline("iota")
    shape = tuple(lw.shape(dst))
    if isinstance(kw.get("pattern"), np.ndarray):
        vals = kw["pattern"].astype(np.float64)
    else:
        vals = _isa._affine_values(shape, kw["pattern"], kw.get("offset", 0), kw.get("channel_multiplier", 0))
    return _write_of(lw, dst, align_to(vals, shape))


@lowering(_nl.shared_constant)
def _shared_constant(lw, step):
    a = bound(_nl.shared_constant, step)
    if isinstance(a["constant"], (str, bytes, View, _Nested)) or hasattr(a["constant"], "__fspath__"):
        raise Decline("shared_constant")  # (a file is read at each launch: it may change)
    arr = np.asarray(a["constant"])
    dtype = _dt.normalize(a["dtype"]) if a["dtype"] is not None else _dt.normalize(arr.dtype)
    slot = single_bind(step)
    w = lw.new_preallocated(slot)
    values = arr.astype(np.float32) if not _dt.is_int(dtype) else arr
    # the interpreter's storage for the constant, made once
    template = np.ascontiguousarray(_dt.from_compute(np.broadcast_to(values, arr.shape), dtype))

    def op(V, X, L):
        np.copyto(V[w], template)
    return op


def _new_tile_of(lw, step, values):
    """The step making a new tile of float32 ``values`` known when lowering."""
    put = lw.produce(step)

    def op(V, X, L):
        put(V, X, values)
    return op


def _write_of(lw, dst, values):
    """The step writing ``values``, known when lowering, into ``dst``."""
    w = lw.writer(dst)

    def op(V, X, L):
        w(V, values)
    return op
