"""The lowering's machinery: the ``Lowerer``, which walks a recorded program once
simulating the bookkeeping the interpreter would do (view table, which value an
engine reads, on-chip buffers by liveness, PSUM validity, loads forwarded from
HBM), the registry mapping an instruction to its lowering, and the argument
parsing every lowering shares."""
from __future__ import annotations

import functools
import inspect

import numpy as np

from .. import dtypes as _dt
from .. import ops as _ops
from ..machine import Buffer
from ..tensor import align_to
from ..trace import View, _WHOLE, _STRIDED, _GATHER
from .program import view_of

F32 = np.float32


class Decline(Exception):
    """The program uses something the lowering does not cover: replay generically."""


class LazyStore:
    """One instruction result held in a slot: does any later step read its rounded storage?"""

    __slots__ = ("store",)

    def __init__(self):
        self.store = False


def instruction_of(f):
    return getattr(f, "_nki_instruction", f)


_LOWERINGS: dict = {}


def lowering(*fns):
    def deco(g):
        for f in fns:
            _LOWERINGS[instruction_of(f)] = g
        return g
    return deco


class Lowerer:
    def __init__(self, program, slot_meta):
        self.p = program
        self.meta = slot_meta          # slot -> (shape, nki dtype, buffer, storage dtype)
        self.vids = {}                 # view key -> vid
        self.view_specs = []           # vid -> (slot, kind, shape, off, strides)
        self.exact = {}                # slot -> holds an instruction's float32 result
        self.cur = {}                  # slot -> LazyStore of a result whose storage is lazy
        self.alias = {}                # result slot -> slot whose storage its float32 value copies
        self.phys_of = {}              # live preallocated slot (on chip or the kernel's HBM scratch) -> buffer
        self.phys_of_all = {}
        self.root = {}                 # slot reinterpreting another's memory (.ap(dtype=), .view()) -> that slot
        self.phys = []
        self.free_phys = {}            # (shape, dtype) -> [phys]
        self.hbm_slots = set(range(program.n_inputs))
        self.pv = {}                   # PSUM slot -> its psum_valid array, as the interpreter's would be
        self.cover = {}                # new HBM tensor's slot -> [elements written so far, read before whole]
        self.fwd = {}                  # loaded slot -> [source vid, source slot, LazyStore, read once already]
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
    def touch_storage(self, slot):
        d = self.cur.get(slot)
        if d is not None:
            d.store = True
        f = self.fwd.pop(slot, None)
        if f is not None:
            f[2].store = True

    def raw(self, view):
        """Storage read (``NkiTensor.read``): a getter g(V)."""
        v = self.vid(view)
        self.touch_storage(view.slot)
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
        self.touch_storage(s)
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
                get.stable = True  # the same for the whole launch (chain_gemms)
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

    def sharing(self, slot):
        """The slots over ``slot``'s memory: itself, what it reinterprets and what reinterprets it."""
        root = self.root.get(slot, slot)
        return {root, *(a for a, r in self.root.items() if r == root)}

    def written(self, view):
        """Bookkeeping of a write into ``view`` (``NkiTensor.write``)."""
        s = view.slot
        same_memory = self.sharing(s) if self.root else (s,)
        for r, src in self.alias.items():
            if src in same_memory and self.exact.get(r):
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
            self.touch_storage(s)
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

    def masked_writer(self, view, mask):
        """Closure w(V, values) doing ``NkiTensor.write(values, mask)`` with a mask known when
        lowering (elements outside it keep what they hold)."""
        shape = tuple(self.shape(view))
        mask = np.broadcast_to(np.asarray(mask, dtype=bool), shape)
        if mask.all():
            return self.writer(view)
        if view.slot in self.pv or view.slot in self.cover:
            raise Decline("masked write into PSUM or a new HBM tensor")  # (validity per element)
        v = self.vid(view)
        _, dt, _, st = self.meta[view.slot]
        tf32 = dt is _dt.tfloat32
        from_compute = _dt.from_compute
        self.touch_storage(view.slot)  # what the mask leaves is read
        self.written(view)
        if view.kind == _GATHER:
            key = view.key[mask]

            def wg(V, vals):
                vals = align_to(vals, shape)
                if vals.dtype != st or tf32:
                    vals = from_compute(vals, dt)
                V[v][key] = np.broadcast_to(vals, shape)[mask]
            return wg

        def w(V, vals):
            vals = align_to(vals, shape)
            if vals.dtype != st or tf32:
                vals = from_compute(vals, dt)
            np.copyto(V[v], vals, where=mask)
        return w

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
    def new_preallocated(self, slot):
        """A new buffer held in a physical buffer preallocated with the lowered program: an
        on-chip tile, or a kernel's own HBM scratch (``private_hbm``, ``hbm``); returns the
        vid of its whole view."""
        shape, _, buffer, st = self.meta[slot]
        if not (buffer.on_chip or buffer in (Buffer.private_hbm, Buffer.hbm)):
            raise Decline("buffer")
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
        # (a buffer is free when neither its tile nor a reinterpretation of it is live)
        if p is not None and p not in self.phys_of.values():
            self.free_phys.setdefault(self.phys[p], []).append(p)

    def reinterpret(self, step, source, flat):
        """``.ap(dtype=)`` (``flat``) or ``.view(dtype)``: the step's new slot is ``source``'s
        memory seen as another dtype. Returns the step's closure, which builds the new slot's
        views over that memory at each launch."""
        slot, s = single_bind(step), source.slot
        if s not in self.meta:
            raise Decline("unknown slot")
        if self.meta[slot][2] is Buffer.psum:
            # the interpreter's new buffer has PSUM validity of its own, none of it valid yet
            self.pv[slot] = np.zeros(tuple(self.meta[slot][0]), dtype=bool)
        # its rounded storage is read through the new slot; like the interpreter's, a result's
        # float32 values stay with the source (a write through the new slot does not reach them)
        self.touch_storage(s)
        c = self.cover.get(s)
        if c is not None:
            c[1] = True  # its elements may be read through the reinterpretation before written
        self.root[slot] = self.root.get(s, s)
        self.exact[slot] = False
        p = self.phys_of.get(s)
        if p is not None:
            self.phys_of[slot] = p  # keeps the memory from reuse while this slot is live
        base = self.whole(s)
        st = self.meta[slot][3]
        views = self.slot_views.setdefault(slot, [])

        def op(V, X, L):
            data = V[base]
            data = data.reshape(-1).view(st) if flat else data.view(st)
            for vid, kind, shape, off, strides in views:
                V[vid] = view_of(data, kind, shape, off, strides)
        return op

    def produce(self, step, values_may_alias=None):
        """``ops.result``: the step's new tile holds a float32 result.  Returns put(V, X, values)."""
        slot = single_bind(step)
        whole = self.new_preallocated(slot)
        _, dt, _, st = self.meta[slot]
        d = LazyStore()
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


def single_bind(step):
    if len(step.binds) != 1 or step.binds[0][0] != ():
        raise Decline("instruction result shape")
    return step.binds[0][1]


@functools.lru_cache(maxsize=None)
def _signature(fn):
    return inspect.signature(fn)


def bound(fn, step):
    """The step's arguments by name, for instruction `fn`; a mask declines
    (no lowering applies one)."""
    try:
        b = _signature(instruction_of(fn)).bind(*step.args, **step.kwargs)
    except TypeError:
        raise Decline("arguments") from None
    b.apply_defaults()
    a = dict(b.arguments)
    a.update(a.pop("kwargs", {}) or {})
    if a.get("mask") is not None:
        raise Decline("mask")
    return a


def style(step, kinds):
    """isa ``_style``: (dst View or None, keyword arguments)."""
    args, kw = step.args, dict(step.kwargs)
    # a positional argument whose beta-1 name is also given by keyword can only be the destination
    new = "dst" in kw or len(args) > len(kinds) or any(n in kw for n, _ in kinds[:len(args)])
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


def emit(lw, step, dst, values_may_alias=None):
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



def binary_op(ga, gb, aa, ab, shape, f, put):
    """The closure of an element-wise binary step: both operands read, those
    flagged (``aa``, ``ab``) broadcast to ``shape``, ``f`` put in float32."""

    def op(V, X, L):
        va, vb = ga(V, X), gb(V, X)
        if aa:
            va = align_to(va, shape)
        if ab:
            vb = align_to(vb, shape)
        with np.errstate(all="ignore"):
            r = f(va, vb)
        put(V, X, np.asarray(r).astype(F32))  # a copy: never an operand itself
    return op
