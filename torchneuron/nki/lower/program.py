"""The lowered form of a recorded program (``FastProgram``): its closures, its view
tables over preallocated on-chip buffers and per-launch HBM storage, and how a
launch builds the kernel's result."""
from __future__ import annotations

import numpy as np

from ..errors import NKIError
from ..machine import Allocation
from ..tensor import NkiTensor as _NkiTensor
from ..trace import View, _Nested, _WHOLE, _GATHER, _UINT_OF_SIZE


def strided_view(data, shape, offset, strides):
    """An ndarray over ``data``'s memory (through a same-size unsigned view, since
    ml_dtypes types have no buffer format)."""
    u = _UINT_OF_SIZE[data.itemsize]
    return np.ndarray(shape, u, data.view(u), offset, strides).view(data.dtype)


def view_of(data, kind, shape, off, strides):
    """View-table entry: the storage, a strided view of it, or (gathered views) its flat form."""
    if kind == _WHOLE:
        return data
    if kind == _GATHER:
        return data.reshape(-1)
    return strided_view(data, shape, off, strides)


class FastProgram:
    """The lowered form of a ``trace.Program``."""

    def __init__(self, n_slots, n_views, instances, input_views, onchip, phys, result, hbm_vids, locations):
        self.n_slots, self.n_views = n_slots, n_views
        self.instances = instances      # [[closure(V, X, L)]] per grid point
        self.locations = locations      # same shape: kernel line of each closure
        self.input_views = input_views  # [(slot, [(vid, kind, shape, off, strides)])]
        self.onchip = onchip            # [(vid, phys, kind, shape, off, strides)]
        self.phys = phys                # [(shape, storage dtype)]
        self.result = result            # template over slots (trace.View / _Nested)
        self.hbm_vids = hbm_vids        # view-table entries to drop after a launch
        self._sets = []                 # idle view tables over preallocated buffers

    def _new_set(self):
        bufs = [np.empty(shape, dt) for shape, dt in self.phys]
        V = [None] * self.n_views + [{}]  # and, last, what a launch leaves for the next (Lowerer.gemm_operand)
        for vid, p, kind, shape, off, strides in self.onchip:
            V[vid] = view_of(bufs[p], kind, shape, off, strides)
        return V

    def replay(self, launch, inputs, slot_meta):
        try:
            V = self._sets.pop()
        except IndexError:
            V = self._new_set()
        X = [None] * self.n_slots
        H = {}
        try:
            for slot, views in self.input_views:
                data = inputs[slot]._alloc.data
                H[slot] = data
                for vid, kind, shape, off, strides in views:
                    V[vid] = view_of(data, kind, shape, off, strides)
            X.append(H)  # HBM storage by slot, for the result (X[-1])
            for k, ops in enumerate(self.instances):
                i = 0
                try:
                    for i, op in enumerate(ops):
                        op(V, X, launch)
                except NKIError as e:
                    if not getattr(e, "placed", False):  # (a chain of steps places its own)
                        e.relocate(self.locations[k][i])
                    raise
            return _result(self.result, H, slot_meta)
        finally:
            for vid in self.hbm_vids:
                V[vid] = None
            for t in V[-1].values():  # the staged tiles kept for the next launch hold no HBM
                t.source = None
            self._sets.append(V)


def _result(template, H, slot_meta):
    allocs = {}

    def make(t):
        if isinstance(t, View):
            alloc = allocs.get(t.slot)
            if alloc is None:
                _, dtype, buffer, _ = slot_meta[t.slot]
                alloc = allocs[t.slot] = Allocation(H[t.slot], buffer, dtype)
            data = alloc.data
            if t.kind == _WHOLE:
                return _NkiTensor(alloc, data, None, None, 0)
            return _NkiTensor(alloc, strided_view(data, t.shape, t.offset, t.strides), None, None, 0)
        if isinstance(t, _Nested):
            if t.kind is dict:
                return {k: make(v) for k, v in t.items}
            return t.kind(make(v) for v in t.items)
        return t
    r = make(template)
    del make  # (recursive: a cycle that would keep the results until a garbage collection)
    return r
