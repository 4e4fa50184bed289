"""Lowerings of new buffers: ``nl.ndarray``, ``zeros``, ``ones``, ``full``."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from .. import language as _nl
from ..machine import Buffer, new_storage, reused_storage
from ..tensor import align_to
from .lowerer import Decline, bound, instruction_of, lowering, single_bind
from .program import _view


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
                V[vid] = _view(data, kind, vshape, off, strides)
        return op
    if not buffer.on_chip:
        raise Decline("private HBM")
    slot = single_bind(step)
    w = lw.new_onchip(slot)
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
    w = lw.new_onchip(slot)
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
