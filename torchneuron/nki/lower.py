"""Lowering a recorded program into pre-bound closures (the fast replay).

A generic replay (``trace.Step.run``) calls each instruction's public
function again: argument parsing, tile objects, validation, allocation and
per-buffer bookkeeping run on every launch.  None of that depends on tile
values, so it can be done once.  ``lower(program)`` walks the recorded steps
once, simulating what the interpreter's bookkeeping would decide at each step,
and turns every step into a closure that does only the array work:

* every tile argument becomes an index into a *view table*: NumPy views built
  once over preallocated on-chip buffers (reused across replays and, by
  liveness, between tiles of the same shape and dtype), or built per launch
  over the HBM arguments and outputs;
* which value an engine reads (the float32 result kept by the instruction
  that produced a tile, or the rounded storage) is decided statically, as
  ``NkiTensor.exact_values`` decides it when interpreting; a result's rounded
  storage is written only if some later step reads it;
* dtypes, rounding functions, operators, broadcast decisions and constant
  masks are resolved when lowering.

* a bf16/fp8 tile loaded from HBM and read by a single engine instruction is
  converted straight from HBM, without the tile copy, unless HBM is written
  while it is live.

The closures perform the same NumPy operations in the same order as the
interpreter, so results are bit-identical (tests/nki/test_trace_cache.py
checks lowered and generic replays against interpretation).  Lowering covers
the common instructions of both language generations (see ``@lowering``
below) on basic, ``.ap()`` and index-grid views.  A program with any other
step (``mask=``, out-of-bounds index grids, dtype reinterpretation, random
numbers, accumulation-register reads, ...) is not lowered (``Decline``) and
replays generically.
"""
from __future__ import annotations

import functools
import inspect
import os

import numpy as np

from . import dtypes as _dt
from . import isa as _isa
from . import language as _nl
from . import ops as _ops
from .errors import NKIError
from .machine import Allocation, Buffer, new_storage, reused_storage
from .tensor import NkiTensor as _NkiTensor, align_to, assign as _assign_op
from .trace import View, _Nested, _WHOLE, _STRIDED, _GATHER, _UINT_OF_SIZE

F32 = np.float32
_errstate = np.errstate
# an engine reads a loaded (not float32) tile straight from HBM, and the load
# copies the tile only if another step reads it (see the module docstring);
# False: every load copies
FORWARD_LOADS = True


class Decline(Exception):
    """The program uses something the lowering does not cover: replay generically."""


class _Def:
    """One instruction result held in a slot: does any later step read its rounded storage?"""

    __slots__ = ("store",)

    def __init__(self):
        self.store = False


def _raw(f):
    return getattr(f, "_nki_instruction", f)


_LOWERINGS: dict = {}


def lowering(*fns):
    def deco(g):
        for f in fns:
            _LOWERINGS[_raw(f)] = g
        return g
    return deco


def strided_view(data, shape, offset, strides):
    """An ndarray over ``data``'s memory (through a same-size unsigned view, since
    ml_dtypes types have no buffer format)."""
    u = _UINT_OF_SIZE[data.itemsize]
    return np.ndarray(shape, u, data.view(u), offset, strides).view(data.dtype)


def _view(data, kind, shape, off, strides):
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
            V[vid] = _view(bufs[p], kind, shape, off, strides)
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
                    V[vid] = _view(data, kind, shape, off, strides)
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


class Lowerer:
    def __init__(self, program, slot_meta):
        self.p = program
        self.meta = slot_meta          # slot -> (shape, nki dtype, buffer, storage dtype)
        self.vids = {}                 # view key -> vid
        self.view_specs = []           # vid -> (slot, kind, shape, off, strides)
        self.exact = {}                # slot -> holds an instruction's float32 result
        self.cur = {}                  # slot -> _Def of a result whose storage is lazy
        self.alias = {}                # result slot -> slot whose storage its float32 value copies
        self.phys_of = {}              # live on-chip slot -> physical buffer
        self.phys_of_all = {}
        self.phys = []
        self.free_phys = {}            # (shape, dtype) -> [phys]
        self.hbm_slots = set(range(program.n_inputs))
        self.pv = {}                   # PSUM slot -> its psum_valid array, as the interpreter's would be
        self.cover = {}                # new HBM tensor's slot -> [elements written so far, read before whole]
        self.fwd = {}                  # loaded slot -> [source vid, source slot, _Def, read once already]
        self.keep = []                 # gathered views (their ids are view-table keys)

    # ---------------------------------------------------------------- views
    def vid(self, view):
        if not isinstance(view, View):
            raise Decline("not a tile")
        if view.mask is not None or (view.kind == _GATHER and view.oob is not None):
            raise Decline("masked view or out-of-bounds index")
        if view.slot not in self.meta:
            raise Decline("unknown slot")
        if view.kind == _GATHER:
            key = (view.slot, view.kind, id(view), None, None)
            self.keep.append(view)
        else:
            key = (view.slot, view.kind, view.shape, view.offset, view.strides)
        v = self.vids.get(key)
        if v is None:
            v = self.vids[key] = len(self.view_specs)
            self.view_specs.append(key)
        return v

    def whole(self, slot):
        v = View.__new__(View)
        v.slot, v.kind, v.shape, v.offset, v.strides, v.mask = slot, _WHOLE, None, None, None, None
        return self.vid(v)

    def shape(self, view):
        if view.kind == _GATHER:
            return view.key.shape
        return self.meta[view.slot][0] if view.kind == _WHOLE else view.shape

    def on_chip(self, view):
        return self.meta[view.slot][2].on_chip

    # ------------------------------------------------------ reads and writes
    def _touch_storage(self, slot):
        d = self.cur.get(slot)
        if d is not None:
            d.store = True
        f = self.fwd.pop(slot, None)
        if f is not None:
            f[2].store = True

    def raw(self, view):
        """Storage read (``NkiTensor.read``): a getter g(V)."""
        v = self.vid(view)
        self._touch_storage(view.slot)
        c = self.cover.get(view.slot)
        if c is not None and not c[0].all():
            c[1] = True
        if view.kind == _GATHER:
            key = view.key
            return lambda V: V[v][key]
        return lambda V: V[v]

    def value(self, view, shared=False):
        """Engine read (``compute_values``): (getter(V, X) -> float32 array, nki dtype, may alias storage).

        ``shared``: the caller only reads the array (a matmul operand), so the float32 form of a
        region of a kernel input that no step writes may be converted once per launch and shared by
        every load of that region."""
        v = self.vid(view)
        s = view.slot
        if not self.on_chip(view):
            raise Decline("engine reads HBM")
        dtype = self.meta[s][1]
        if view.kind == _WHOLE and self.exact.get(s):
            return (lambda V, X: X[s]), dtype, False
        f = self.fwd.get(s) if view.kind == _WHOLE else None
        if f is not None and not f[3]:
            # the first engine read of a loaded tile converts straight from the
            # loaded region (same bits as the tile; a new C-ordered float32
            # array, as converting the tile's own storage gives); a tile read
            # again is copied by its load, which is cheaper from then on
            f[3] = True
            src = f[0]
            if shared and f[1] in self.read_only:
                return self.per_launch(("float32", src), lambda V: V[src].astype(F32, order="C")), dtype, False
            return (lambda V, X: V[src].astype(F32, order="C")), dtype, False
        self._touch_storage(s)
        if view.kind == _GATHER:
            key = view.key
            if self.meta[s][3] == F32:
                return (lambda V, X: V[v][key]), dtype, False
            return (lambda V, X: V[v][key].astype(F32)), dtype, False
        if self.meta[s][3] == F32:
            return (lambda V, X: V[v]), dtype, True
        return (lambda V, X: V[v].astype(F32)), dtype, False

    def gemm_operand(self, view, stationary):
        """Tensor Engine read (``ops._gemm_operand``): a getter g(V, X) of the tile's
        bfloat16 storage where that is its value, else of its float32 values.

        A region of a kernel argument that stays as it is during the launch
        (``_read_only_inputs``) is staged for the matrix unit once per launch
        (``ops.stage_tile``) and shared by every load of that region."""
        s = view.slot
        if not (_ops.BF16_TILE_GEMM and self.on_chip(view) and self.meta[s][3] == _dt.bfloat16
                and not (view.kind == _WHOLE and self.exact.get(s))):
            return self.value(view, shared=True)[0]
        f = self.fwd.get(s) if view.kind == _WHOLE else None
        if f is not None and not f[3]:
            # a loaded tile's first engine read takes the loaded region itself
            f[3] = True
            src = f[0]
            if f[1] in self.read_only:
                key, stage, staged = ("staged", src, stationary), _ops.stage_tile, _ops.StagedTile

                def make(V):
                    # into the staged tile an earlier launch of this view table left
                    kept = V[-1]
                    t = stage(V[src], stationary, kept.get(key))
                    if isinstance(t, staged):
                        kept[key] = t
                    return t
                get = self.per_launch(key, make)
                get.stable = True  # the same for the whole launch (_chain_gemms)
                return get
            return lambda V, X: V[src]
        g = self.raw(view)
        return lambda V, X: g(V)

    @staticmethod
    def per_launch(key, make):
        """Getter of ``make(V)``, made once per launch (kept with the launch's HBM storage)."""
        def get(V, X):
            H = X[-1]
            a = H.get(key)
            if a is None:
                a = H[key] = make(V)
            return a
        return get

    def operand(self, x):
        """``ops.operand``: (getter, dtype or None, static shape)."""
        if isinstance(x, View):
            g, d, _ = self.value(x)
            return g, d, self.shape(x)
        if isinstance(x, (bool, np.bool_)):
            c = F32(bool(x))
        elif isinstance(x, (int, float, np.integer, np.floating)):
            c = F32(x)
        else:
            raise Decline("operand kind")
        return (lambda V, X: c), None, ()

    def written(self, view):
        """Bookkeeping of a write into ``view`` (``NkiTensor.write``)."""
        s = view.slot
        for r, src in self.alias.items():
            if src == s and self.exact.get(r):
                # the interpreter's result would see this write (it shares the storage)
                raise Decline("a result aliasing this tile's storage is still live")
        hbm = not self.meta[s][2].on_chip
        for t, f in list(self.fwd.items()):
            # the loaded region may change (HBM arguments can share memory):
            # the tile must hold its own copy
            if hbm or f[1] == s:
                f[2].store = True
                del self.fwd[t]
        if view.kind != _WHOLE:
            self._touch_storage(s)
        self.fwd.pop(s, None)
        self.exact[s] = False
        self.cur.pop(s, None)
        self.mark_valid(view)

    def valid_region(self, view):
        """The part of the slot's simulated psum_valid array ``view`` covers (None if not PSUM)."""
        pv = self.pv.get(view.slot)
        return None if pv is None else self._region(pv, view)

    def _region(self, flags, view):
        """The part of ``flags`` (a bool array of the slot's shape) that ``view`` covers."""
        if view.kind == _WHOLE:
            return flags
        if view.kind == _GATHER:
            return flags.reshape(-1)[view.key]  # (a copy)
        isz = self.meta[view.slot][3].itemsize
        return np.lib.stride_tricks.as_strided(flags.reshape(-1)[view.offset // isz:], shape=view.shape,
                                               strides=[st // isz for st in view.strides])

    def mark_valid(self, view):
        for flags in (self.pv.get(view.slot), self.cover.get(view.slot, (None,))[0]):
            if flags is None:
                continue
            if view.kind == _GATHER:
                flags.reshape(-1)[view.key] = True
            else:
                self._region(flags, view)[...] = True

    def writer(self, view):
        """Closure w(V, values) doing ``NkiTensor.write(values)`` (no mask) into ``view``."""
        v = self.vid(view)
        shape = tuple(self.shape(view))
        _, dt, _, st = self.meta[view.slot]
        tf32 = dt is _dt.tfloat32
        from_compute = _dt.from_compute
        self.written(view)
        if view.kind == _GATHER:
            key = view.key

            def wg(V, vals):
                if vals.shape != shape:
                    vals = align_to(vals, shape)
                if vals.dtype != st or tf32:
                    vals = from_compute(vals, dt)
                V[v][key] = vals
            return wg

        # float32 values into bfloat16 storage with contiguous rows: rounded
        # straight into it (the bits of from_compute, without its array)
        rnd = _dt.ROUND_TO_BF16 if dt == _dt.bfloat16 and st == _dt.bfloat16 else None
        if not ((view.kind == _WHOLE and self.on_chip(view))
                or (view.kind == _STRIDED and len(shape) == 2 and view.strides[1] == st.itemsize)):
            rnd = None

        def w(V, vals):
            if vals.shape != shape:
                vals = align_to(vals, shape)
            if rnd is not None and vals.dtype == F32 and vals.flags.c_contiguous:
                rnd(vals, V[v])
                return
            if vals.dtype != st or tf32:
                vals = from_compute(vals, dt)
            V[v][...] = vals
        return w

    # -------------------------------------------------------- new buffers
    def new_onchip(self, slot):
        shape, _, buffer, st = self.meta[slot]
        if not buffer.on_chip:
            raise Decline("not on chip")
        key = (tuple(shape), st)
        free = self.free_phys.get(key)
        if free:
            p = free.pop()
        else:
            p = len(self.phys)
            self.phys.append(key)
        self.phys_of[slot] = self.phys_of_all[slot] = p
        self.exact[slot] = False
        self.cur.pop(slot, None)
        if buffer is Buffer.psum:
            self.pv[slot] = np.zeros(shape, dtype=bool)
        return self.whole(slot)

    def release(self, slot):
        self.fwd.pop(slot, None)
        self.alias.pop(slot, None)
        p = self.phys_of.pop(slot, None)
        if p is not None:
            self.free_phys.setdefault(self.phys[p], []).append(p)

    def produce(self, step, values_may_alias=None):
        """``ops.result``: the step's new tile holds a float32 result.  Returns put(V, X, values)."""
        slot = _single_bind(step)
        whole = self.new_onchip(slot)
        _, dt, _, st = self.meta[slot]
        d = _Def()
        self.cur[slot] = d
        self.exact[slot] = True
        if values_may_alias is not None:
            self.alias[slot] = values_may_alias
        else:
            self.alias.pop(slot, None)
        copy = values_may_alias is not None
        if slot in self.pv:
            self.pv[slot][...] = True
        from_compute = _dt.from_compute
        plain = st == F32 and dt is not _dt.tfloat32

        def put(V, X, vals):
            if vals.dtype != F32:
                vals = vals.astype(F32)
            if vals.ndim == 0:
                vals = vals.reshape(1, 1)
            if copy:
                vals = vals.copy()  # the interpreter's result would share the source's storage
            X[slot] = vals
            if d.store:
                V[whole][...] = vals if plain else from_compute(vals, dt)
        return put


def _single_bind(step):
    if len(step.binds) != 1 or step.binds[0][0] != ():
        raise Decline("instruction result shape")
    return step.binds[0][1]


@functools.lru_cache(maxsize=None)
def _signature(fn):
    return inspect.signature(fn)


def _bound(fn, step):
    """The step's arguments by name, for instruction `fn`; a mask declines
    (no lowering applies one)."""
    try:
        b = _signature(_raw(fn)).bind(*step.args, **step.kwargs)
    except TypeError:
        raise Decline("arguments") from None
    b.apply_defaults()
    a = dict(b.arguments)
    a.update(a.pop("kwargs", {}) or {})
    if a.get("mask") is not None:
        raise Decline("mask")
    return a


def _style(step, kinds):
    """isa ``_style``: (dst View or None, keyword arguments)."""
    args, kw = step.args, dict(step.kwargs)
    new = "dst" in kw or len(args) > len(kinds)
    if not new:
        for a, (_, kind) in zip(args, kinds):
            if (kind == "T" and not isinstance(a, View)) or (kind == "F" and isinstance(a, View)):
                new = True
                break
    dst = None
    if new:
        if "dst" in kw:
            dst = kw.pop("dst")
        else:
            dst, args = args[0], args[1:]
        if not isinstance(dst, View):
            raise Decline("dst")
    for a, (n, _) in zip(args, kinds):
        if n in kw:
            raise Decline("arguments")
        kw[n] = a
    if len(args) > len(kinds):
        raise Decline("arguments")
    if kw.get("mask") is not None:
        raise Decline("mask")
    return dst, kw


def _emit(lw, step, dst, values_may_alias=None):
    """isa ``_emit`` (no mask): a new result tile, or a write into ``dst``."""
    if dst is None:
        return lw.produce(step, values_may_alias)
    if not lw.on_chip(dst):
        raise Decline("dst in HBM")
    w = lw.writer(dst)
    shape = tuple(lw.shape(dst))

    def put(V, X, vals):
        w(V, align_to(np.asarray(vals, dtype=F32), shape))
    return put


# ------------------------------------------------------------ allocation
@lowering(_nl.ndarray)
def _ndarray(lw, step):
    a = _bound(_nl.ndarray, step)
    buffer = _nl._buffer(a["buffer"])
    if buffer is Buffer.shared_hbm:
        if not step.binds:
            return None  # a later SPMD instance gets the same tensor
        slot = _single_bind(step)
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
    slot = _single_bind(step)
    w = lw.new_onchip(slot)
    shape, dt, _, _ = lw.meta[slot]
    template = new_storage(tuple(shape), dt, lw.debug)

    def op(V, X, L):
        np.copyto(V[w], template)
    return op


@lowering(_nl.zeros, _nl.ones, _nl.full)
def _full(lw, step):
    fn = _raw(step.fn)
    a = _bound(fn, step)
    fill = {_raw(_nl.zeros): 0, _raw(_nl.ones): 1}.get(fn, a.get("fill_value"))
    if isinstance(fill, np.ndarray) or not _nl._buffer(a["buffer"]).on_chip:
        raise Decline("full")
    slot = _single_bind(step)
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


# ---------------------------------------------------------- data movement
def _load(lw, step, transpose):
    fn = _raw(step.fn)
    a = _bound(fn, step)
    src = a["src"]
    if not isinstance(src, View) or lw.on_chip(src) or not lw.shape(src):
        raise Decline("load source")
    forward = src.kind != _GATHER and FORWARD_LOADS
    if forward:
        r = lw.vid(src)
        lw._touch_storage(src.slot)
    g = lw.raw(src)
    slot = _single_bind(step)
    w = lw.new_onchip(slot)
    _, dt, _, st = lw.meta[slot]
    same = lw.meta[src.slot][3] == st and dt is not _dt.tfloat32
    from_compute = _dt.from_compute
    if same and st != F32 and not transpose and forward:
        # the copy is made only if a step reads the tile other than by one
        # engine read (or the loaded region changes while the tile is live)
        if tuple(lw.shape(src)) != tuple(lw.meta[slot][0]):
            raise Decline("load shape")
        d = _Def()
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
    a = _bound(_nl.store, step)
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


# ------------------------------------------------------------ arithmetic
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
    a = _bound(_ops.unary, step)
    return _unary_op(lw, step, a["f"], a["x"], a["dtype"])


@lowering(_nl.copy)
def _lower_copy(lw, step):
    a = _bound(_nl.copy, step)
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
    put = lw.produce(step)

    def op(V, X, L):
        va, vb = ga(V, X), gb(V, X)
        if aa:
            va = align_to(va, shape)
        if ab:
            vb = align_to(vb, shape)
        with _errstate(all="ignore"):
            r = f(va, vb)
        put(V, X, np.asarray(r).astype(F32))
    return op


@lowering(_ops.binary)
def _lower_binary(lw, step):
    a = _bound(_ops.binary, step)
    return _binary_op(lw, step, a["f"], a["a"], a["b"], a["dtype"])


@lowering(_ops.update)
def _update(lw, step):
    a = _bound(_ops.update, step)
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
        lw._touch_storage(target.slot)
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
        lw._touch_storage(target.slot)
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
    fn = _raw(step.fn)
    a = _bound(fn, step)
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
    raw = _raw(_f)
    if callable(_f) and getattr(_f, "_nki_instruction", None) and (hasattr(raw, "_unary") or hasattr(raw, "_binary")):
        _LOWERINGS[raw] = _lang_elementwise


# ------------------------------------------------------------------ isa
def _matmul_operands(gs, gm):
    """Getter of a matmul's (stationary, moving) as 2-D arrays, for ``ops.tile_gemm``."""
    staged = _ops.StagedTile

    def operands(V, X):
        s, m = gs(V, X), gm(V, X)
        return (s if isinstance(s, staged) else s.reshape(s.shape[0], -1),
                m if isinstance(m, staged) else m.reshape(m.shape[0], -1))
    return operands


def _matmul_getter(gs, gm):
    gemm, operands = _ops.tile_gemm, _matmul_operands(gs, gm)
    return lambda V, X: gemm(*operands(V, X))


@lowering(_isa.nc_matmul)
def _nc_matmul(lw, step):
    dst, kw = _style(step, [("stationary", "T"), ("moving", "T")])
    gs, gm = lw.gemm_operand(kw["stationary"], True), lw.gemm_operand(kw["moving"], False)
    if dst is None:
        return _product(lw, step, gs, gm)
    mm = _matmul_getter(gs, gm)
    if lw.meta[dst.slot][2] is not Buffer.psum:
        raise Decline("nc_matmul dst")
    shape = tuple(lw.shape(dst))
    acc = kw.get("accumulate")
    _, dt, _, _ = lw.meta[dst.slot]
    region = lw.valid_region(dst)
    if (acc is not False and dt is not _dt.tfloat32 and dt == F32 and dst.kind != _GATHER
            and (acc is not None or region.all())):
        # update_in_place
        t = lw.vid(dst)
        lw._touch_storage(dst.slot)
        lw.written(dst)

        def op(V, X, L):
            r = mm(V, X)
            if r.shape != shape:
                r = align_to(r, shape)
            with _errstate(all="ignore"):
                np.add(V[t], r, out=V[t])
        return op
    if acc is False:
        w = lw.writer(dst)

        def op(V, X, L):
            r = mm(V, X)
            w(V, align_to(r, shape))
        return op
    cur, _, _ = lw.value(dst)
    keep = None if acc is not None else region.copy()
    w = lw.writer(dst)
    zero = F32(0)

    def op(V, X, L):
        r = align_to(mm(V, X), shape)
        c = cur(V, X)
        if keep is not None:
            c = np.where(keep, c, zero)
        w(V, c + r)
    return op


@lowering(_nl.matmul)
def _nl_matmul(lw, step):
    a = _bound(_nl.matmul, step)
    x, y = a["x"], a["y"]
    if not isinstance(x, View) or not isinstance(y, View):
        raise Decline("matmul operands")
    if a["transpose_x"]:
        gx = lw.gemm_operand(x, True)
    else:
        # nl.transpose(x): a result tile of its own in the interpreter, read back exactly
        g0, _, _ = lw.value(x)

        def gx(V, X):
            return np.ascontiguousarray(g0(V, X).T)
    return _product(lw, step, gx, lw.gemm_operand(y, False))


def _product(lw, step, gs, gm):
    """A matmul whose result is a new PSUM tile. If the next step is ``psum += <it>``,
    that step computes the product into its PSUM tile (``_update`` sets ``taken``)
    and this one only hands it the operands, in the product's slot (per launch):
    this step's frees may release them."""
    put, mm = lw.produce(step), _matmul_getter(gs, gm)
    slot, operands, taken = _single_bind(step), _matmul_operands(gs, gm), [False]
    stable = getattr(gs, "stable", False) and getattr(gm, "stable", False)
    lw.product = (lw.step_index, slot, taken, stable)

    def op(V, X, L):
        if taken[0]:
            X[slot] = operands(V, X)
        else:
            put(V, X, mm(V, X))
    op.hands_off = taken  # [True]: it only hands its operands to the next step
    return op


@lowering(_isa.tensor_tensor)
def _tensor_tensor(lw, step):
    dst, kw = _style(step, [("data1", "T"), ("data2", "T"), ("op", "F")])
    a, b = kw["data1"], kw["data2"]
    if not isinstance(a, View) or not isinstance(b, View):
        raise Decline("tensor_tensor")
    f = _ops.resolve_binary(kw["op"])
    ga, _, _ = lw.value(a)
    gb, _, _ = lw.value(b)
    sa, sb = tuple(lw.shape(a)), tuple(lw.shape(b))
    shape = _ops.out_shape(np.empty(sa, np.bool_), np.empty(sb, np.bool_))
    aa, ab = sa != shape, sb != shape
    put = _emit(lw, step, dst)

    def op(V, X, L):
        va, vb = ga(V, X), gb(V, X)
        if aa:
            va = align_to(va, shape)
        if ab:
            vb = align_to(vb, shape)
        with _errstate(all="ignore"):
            r = np.asarray(f(va, vb), dtype=F32)
        put(V, X, r)
    return op


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


@lowering(_isa.nc_transpose)
def _nc_transpose(lw, step):
    dst, kw = _style(step, [("data", "T")])
    g, d, _ = lw.value(kw["data"])
    put = _emit(lw, step, dst)

    def op(V, X, L):
        v = g(V, X)
        v = v.reshape(v.shape[0], -1)
        put(V, X, np.ascontiguousarray(v.T))
    return op


@lowering(_isa.tensor_copy)
def _tensor_copy(lw, step):
    dst, kw = _style(step, [("src", "T")])
    src = kw["src"]
    g, d, may_alias = lw.value(src)
    put = _emit(lw, step, dst, src.slot if may_alias else None)

    def op(V, X, L):
        put(V, X, g(V, X))
    return op


@lowering(_isa.affine_select)
def _affine_select(lw, step):
    if (step.args and isinstance(step.args[0], View)) or "dst" in step.kwargs:
        raise Decline("dst form")
    kw = dict(step.kwargs)
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
    dst, kw = _style(step, [("op", "F"), ("data", "T"), ("axis", "A")])
    data = kw["data"]
    g, d, _ = lw.value(data)
    ndim = len(lw.shape(data))
    axes = _ops.normalize_axis(kw.get("axis"), ndim)
    f = _ops.resolve_binary(kw["op"])
    if not isinstance(f, np.ufunc):
        raise Decline("reduction op")
    keepdims, negate = kw.get("keepdims", False), kw.get("negate", False)
    put = _emit(lw, step, dst)

    def op(V, X, L):
        with _errstate(all="ignore"):
            r = f.reduce(g(V, X), axis=axes, keepdims=keepdims)
        if negate:
            r = -r
        put(V, X, np.asarray(r, dtype=F32))
    return op


@lowering(_isa.activation)
def _activation(lw, step):
    dst, kw = _style(step, [("op", "F"), ("data", "T"), ("bias", "A"), ("scale", "A")])
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
    put = _emit(lw, step, dst, data.slot if may_alias else None)

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


@lowering(_isa.tensor_scalar)
def _tensor_scalar(lw, step):
    dst, kw = _style(step, [("data", "T"), ("op0", "F"), ("operand0", "A"), ("reverse0", "A"),
                            ("op1", "F"), ("operand1", "A"), ("reverse1", "A")])
    data = kw["data"]
    g, d, _ = lw.value(data)
    dshape = tuple(lw.shape(data))
    stages = []
    for i in ("0", "1"):
        op_ = kw.get("op" + i)
        if op_ is None:
            if i == "0":
                raise Decline("tensor_scalar")
            break
        go, _, so = lw.operand(kw["operand" + i])
        stages.append((_ops.resolve_binary(op_), go, bool(so), bool(kw.get("reverse" + i, False))))
    put = _emit(lw, step, dst)

    def op(V, X, L):
        r = g(V, X)
        for f, go, align, rev in stages:
            o = go(V, X)
            if align:
                o = align_to(o, r.shape)
            with _errstate(all="ignore"):
                r = np.asarray(f(o, r) if rev else f(r, o), dtype=F32)
        put(V, X, r)
    return op


@lowering(_NkiTensor.ap)
def _ap(lw, step):
    # an access pattern over the same buffer is only a view: later steps
    # record it as one; with dtype= it would be a second buffer sharing memory
    if step.kwargs.get("dtype") is not None or not isinstance(step.args[0], View):
        raise Decline("ap with dtype")
    if step.binds:
        raise Decline("ap")
    return None


@lowering(_isa.scalar_tensor_tensor)
def _scalar_tensor_tensor(lw, step):
    dst, kw = _style(step, [("data", "T"), ("op0", "F"), ("operand0", "A"), ("op1", "F"),
                            ("operand1", "T"), ("reverse0", "A"), ("reverse1", "A")])
    g, _, _ = lw.value(kw["data"])
    g0, _, s0 = lw.operand(kw["operand0"])
    g1, _, s1 = lw.operand(kw["operand1"])
    stages = [(_ops.resolve_binary(kw["op0"]), g0, bool(s0), bool(kw.get("reverse0", False))),
              (_ops.resolve_binary(kw["op1"]), g1, bool(s1), bool(kw.get("reverse1", False)))]
    put = _emit(lw, step, dst)

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


def _per_row(fn):
    """The lowering of an instruction that maps each row of its (2-D) data."""
    def lower(lw, step):
        dst, kw = _style(step, [("data", "T")])
        g, _, _ = lw.value(kw["data"])
        put = _emit(lw, step, dst)

        def op(V, X, L):
            v = g(V, X)
            put(V, X, fn(v.reshape(v.shape[0], -1)))
        return op
    return lower


lowering(_isa.bn_stats)(_per_row(_isa.bn_stats_of))
lowering(_isa.bn_aggr)(_per_row(_isa.bn_aggr_of))


# ----------------------------------------------------------------- driver
def lower(program, slot_meta, debug):
    """The FastProgram for ``program``; raises Decline if a step is not covered."""
    lw = Lowerer(program, slot_meta)
    lw.debug = debug
    lw.slot_views = {}
    lw.read_only = _read_only_inputs(program)
    for s in range(program.n_inputs):
        lw.exact[s] = False
    instances, locations = [], []
    for _, steps in program.instances:
        steps_out = []  # (closure or None, frees, kernel line)
        lw.product = None  # (step index, slot, taken, stable) of the last matmul into a new PSUM tile (_product)
        for lw.step_index, step in enumerate(steps):
            g = _LOWERINGS.get(step.fn)
            if g is None:
                raise Decline(f"instruction {getattr(step.fn, '__name__', step.fn)}")
            op = g(lw, step)
            for s in step.frees:
                lw.release(s)
            if op is not None or step.frees:
                steps_out.append((op, step.frees, step.location))
        ops, locs = _chain_gemms(steps_out)
        instances.append(ops)
        locations.append(locs)
    # which view-table entries are over HBM (per launch) and which over preallocated buffers
    input_views, onchip, hbm_vids = {}, [], []
    for vid, (slot, kind, shape, off, strides) in enumerate(lw.view_specs):
        entry = (vid, kind, shape, off, strides)
        if slot in lw.phys_of_all:
            onchip.append((vid, lw.phys_of_all[slot], kind, shape, off, strides))
        elif slot < program.n_inputs:
            input_views.setdefault(slot, []).append(entry)
            hbm_vids.append(vid)
        elif slot in lw.slot_views:
            lw.slot_views[slot].append(entry)
            hbm_vids.append(vid)
        else:
            raise Decline("view of an unknown buffer")
    for c in lw.cover.values():
        c.append(bool(c[0].all()) and not c[1])
    _check_result(program.result, lw)
    return FastProgram(program.n_slots, len(lw.view_specs), instances, sorted(input_views.items()), onchip,
                       lw.phys, program.result, hbm_vids, locations)


_HBM_WRITERS = None


def _read_only_inputs(program):
    """Kernel arguments known to stay as they are during a launch: all of them if no
    step writes one (only the DMA instructions and assignment can write HBM), else none."""
    global _HBM_WRITERS
    if _HBM_WRITERS is None:
        _HBM_WRITERS = {_raw(_nl.store), _raw(_isa.dma_copy), _raw(_isa.dma_transpose), _raw(_assign_op)}
    written = set()
    for _, steps in program.instances:
        for step in steps:
            if step.fn in _HBM_WRITERS:
                dst = step.kwargs.get("dst", step.args[0] if step.args else None)
                if isinstance(dst, View):
                    written.add(dst.slot)
                elif isinstance(dst, _Nested) or dst is None:
                    written.update(range(program.n_inputs))
    # a written argument may share memory with any other (the caller's arrays
    # can overlap), so then no argument is known to stay as it is
    return set() if written & set(range(program.n_inputs)) else set(range(program.n_inputs))


def _check_result(t, lw):
    if isinstance(t, View):
        if t.kind not in (_WHOLE, _STRIDED) or t.mask is not None or t.slot not in lw.hbm_slots:
            raise Decline("result")
    elif isinstance(t, _Nested):
        for x in t.items:
            _check_result(x[1] if t.kind is dict else x, lw)


def _inert(op):
    """Whether ``op`` only writes a tile of its own (a load) or hands a matmul's
    operands on (``_product``): a PSUM accumulation may run after it."""
    return op is not None and (getattr(op, "loads", False) or getattr(op, "hands_off", (False,))[0])


def _chain_gemms(steps):
    """The closures and kernel lines of ``steps`` [(op, frees, line)], with each
    run of ``psum += nc_matmul(...)`` into one PSUM tile (operands the same for
    the whole launch), separated only by inert steps, made one closure: the
    inert steps in order, then the products added to the tile in order
    (``ops.tile_gemm_chain``). Every element gets the same sums in the same
    order; the tile is read and written once instead of once per product."""
    ops, locs, i = [], [], 0
    while i < len(steps):
        op, frees, loc = steps[i]
        target = getattr(op, "chain", (None,))[0]
        run, j, last = [steps[i]], i + 1, i
        while target is not None and j < len(steps):
            o = steps[j][0]
            if getattr(o, "chain", (None,))[0] == target:
                last = j
            elif not _inert(o):
                break
            run.append(steps[j])
            j += 1
        if last > i:
            ops.append(_chain_op(run[:last - i + 1], target))
            locs.append(loc)
            i = last + 1
            continue
        if op is not None or frees:
            ops.append(_with_frees(op, frees) if frees else op)
            locs.append(loc)
        i += 1
    return ops, locs


def _chain_op(run, target):
    chain = _ops.tile_gemm_chain
    seq = [(getattr(op, "chain", (None, None))[1], op, tuple(frees), loc) for op, frees, loc in run]

    def op(V, X, L):
        pairs = []
        for held, f, frees, loc in seq:
            if held is not None:
                pairs.append(X[held])
            elif f is not None:
                try:
                    f(V, X, L)
                except NKIError as e:
                    e.relocate(loc)
                    e.placed = True
                    raise
            for s in frees:
                X[s] = None
        chain(pairs, V[target])
    return op


def _with_frees(op, frees):
    if op is None:
        def run(V, X, L):
            for s in frees:
                X[s] = None
        return run

    def run(V, X, L):
        op(V, X, L)
        for s in frees:
            X[s] = None
    return run


# ------------------------------------------------------------------ replay
def fast_replay() -> bool:
    """Replay lowered programs when possible?  TORCHNEURON_NKI_FAST_REPLAY=0 turns it off."""
    return os.environ.get("TORCHNEURON_NKI_FAST_REPLAY", "1").lower() not in ("0", "false", "no", "off")


def lowered(program, launch):
    """The lowered form of a recorded ``trace.Program`` (built at its first replay), or None."""
    fast = program.fast
    if fast is None:
        try:
            fast = lower(program, program.slot_meta, launch.debug)
        except Decline as e:
            fast, program.fast_declined = False, str(e)
        program.fast = fast
    return fast or None


def replay(program, launch, inputs):
    """Run a recorded program on new input tensors (in argument order): lowered where it
    can be, else step by step; returns the kernel's result."""
    if fast_replay():
        fast = lowered(program, launch)
        if fast is not None:
            return fast.replay(launch, inputs, program.slot_meta)
    return program.replay(launch, inputs)
