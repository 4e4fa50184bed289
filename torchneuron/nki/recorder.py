"""The instruction recorder: what the instructions of one launch were.

A launch's ``Recorder`` sees each outermost kernel-visible instruction and keeps
what the launch asks of it, one or both of:

* the steps of a replayable ``trace.Program``, while the trace cache records a
  signature (``with Recorder(inputs)``; the instruction hook, instruction.py,
  hands it every call): each instruction with its tile arguments as
  ``trace.View``s of buffer slots.  What makes a launch unreplayable (trace.py's
  docstring) poisons the program (``reason``) and ends this part of the recording;
* the performance model's ``Record``s, while a launch is profiled (the recorder is
  the launch's ``profile``, which each instance's liveness count hands every
  instruction with its step): each instruction with its kernel line, instance,
  step, and the regions of memory it reads and writes (memory, dtype, shape,
  bytes, the region of its buffer, the contiguous run a DMA would move).
"""
from __future__ import annotations

import math
import weakref

import numpy as np

from . import dtypes as _dt
from .errors import kernel_location
from .instruction import _tls
from .liveness import kernel_site
from .ops import UNARY
from .tensor import NkiTensor
from .trace import Program, Step, View, _Nested


class _Untraceable(Exception):
    pass


# ----------------------------------------------------------- the records
class Access:
    """One tensor an instruction touches."""

    __slots__ = ("root", "buffer", "dtype", "itemsize", "n", "partitions", "box", "run", "write",
                 "inner_stride", "role")

    def __init__(self, root, buffer, dtype, itemsize, n, partitions, box, run, write, inner_stride, role=None):
        self.root, self.buffer, self.dtype, self.itemsize = root, buffer, dtype, itemsize
        self.n, self.partitions, self.box, self.run = n, partitions, box, run
        self.write, self.inner_stride, self.role = write, inner_stride, role

    @property
    def nbytes(self):
        return self.n * self.itemsize

    @property
    def free(self):
        return self.n // max(1, self.partitions)


class Record:
    """One executed instruction: what the model needs to cost and order it."""

    __slots__ = ("name", "kind", "accesses", "options", "site", "instance", "step")

    def __init__(self, name, kind, accesses, options, site, instance, step):
        self.name, self.kind, self.accesses, self.options = name, kind, accesses, options
        self.site, self.instance, self.step = site, instance, step


_UNARY_NAMES = None


def _unary_name(f):
    global _UNARY_NAMES
    if _UNARY_NAMES is None:
        _UNARY_NAMES = {id(v): k for k, v in UNARY.items()}
    return _UNARY_NAMES.get(id(f), getattr(f, "__name__", "op"))


# where a written argument is, per instruction, when it is not the result
_WRITES_FIRST_ARG = {"store", "assign", "update", "dma_copy", "dma_transpose"}
_WRITTEN_KWARGS = ("dst", "reduce_res", "dst_scale", "out")


class Recorder:
    """Records the instructions of one launch: a replayable program's steps (from the
    arguments ``inputs`` on, while entered) and the performance model's records."""

    def __init__(self, inputs=()):
        # the program: buffers by slot, the kernel arguments first
        self.depth = 0
        self.reason = None
        self.slots = weakref.WeakKeyDictionary()  # Allocation -> slot (weak: liveness is accounted)
        self.meta = {}
        for t in inputs:
            self.meta[self.slots.setdefault(t._alloc, len(self.slots))] = _meta(t._alloc)
        self.n_inputs = len(inputs)
        self.n_slots = len(self.slots)
        self.instances = []
        self.steps = None
        # the performance model's records
        self.records: list[Record] = []
        self._ids = weakref.WeakKeyDictionary()
        self._next_id = 0
        self._geometry: dict = {}
        self.instance = ()
        # (program id, liveness.Liveness) of each instance: the tiles' allocation and last-use steps
        self.lives = []

    # ------------------------------------------------------- the program
    def __enter__(self):
        self.prev = getattr(_tls, "rec", None)
        if self.prev is not None:
            self.prev.poison("the kernel launches another kernel")
        _tls.rec = self
        return self

    def __exit__(self, *exc):
        _tls.rec = self.prev
        return False

    def attach_thread(self):
        """Record this thread's instructions too (an LNC instance running on a thread of its own);
        returns what ``detach_thread`` restores."""
        prev = getattr(_tls, "rec", None)
        _tls.rec = self if self.reason is None else None
        return prev

    @staticmethod
    def detach_thread(prev):
        _tls.rec = prev

    def begin_instance(self, program_id):
        self.steps = []
        self.instances.append((tuple(program_id), self.steps))

    def poison(self, reason):
        if self.reason is None:
            self.reason = reason
        if getattr(_tls, "rec", None) is self:
            _tls.rec = None  # stop recording; the launch goes on interpreting

    def call(self, fn, args, kwargs):
        """Run an outermost instruction (from the instruction hook) and append it to the program."""
        try:
            memo = {}
            targs = tuple(self._template(a, memo) for a in args)
            tkwargs = {k: self._template(v, memo) for k, v in kwargs.items()}
        except _Untraceable as e:
            self.poison(str(e))
            return fn(*args, **kwargs)
        location = kernel_location()
        self.depth += 1
        try:
            out = fn(*args, **kwargs)
        finally:
            self.depth -= 1
        binds = []
        self._bind(out, (), binds)
        self.steps.append(Step(fn, targs, tkwargs, binds, location))
        return out

    def _slot(self, t):
        slot = self.slots.get(t._alloc)
        if slot is None:
            raise _Untraceable(f"an instruction at {kernel_location()} was given {t!r}, which no instruction "
                               "of this launch created")
        return slot

    def _template(self, v, memo):
        if isinstance(v, NkiTensor):
            view = memo.get(id(v))
            if view is None:
                view = memo[id(v)] = View(self._slot(v), v)
            return view
        if isinstance(v, (list, tuple)):
            items = [self._template(x, memo) for x in v]
            if not any(isinstance(x, (View, _Nested)) for x in items):
                return v
            return _Nested(type(v) if type(v) in (list, tuple) else tuple, items)
        if isinstance(v, dict):
            items = [(k, self._template(x, memo)) for k, x in v.items()]
            if not any(isinstance(x, (View, _Nested)) for _, x in items):
                return v
            return _Nested(dict, items)
        if isinstance(v, np.ndarray):
            # index grids and masks are the kernel's own arrays: it may change them later
            return v.copy()
        return v

    def _bind(self, out, path, binds):
        if isinstance(out, NkiTensor):
            if out._alloc not in self.slots:
                self.slots[out._alloc] = self.n_slots
                self.meta[self.n_slots] = _meta(out._alloc)
                binds.append((path, self.n_slots))
                self.n_slots += 1
        elif isinstance(out, (list, tuple)):
            for i, x in enumerate(out):
                self._bind(x, path + (i,), binds)

    def finish(self, result):
        """The Program, or None if the launch was not replayable (``reason`` says why)."""
        if self.reason is not None:
            return None
        try:
            template = self._template(result, {})
        except _Untraceable as e:
            self.reason = f"the kernel returns a tensor no instruction created ({e})"
            return None
        return Program(self.n_inputs, self.n_slots, self.instances, template, self.meta)

    # ------------------------------------------ the performance model's records
    def _root_id(self, alloc):
        rid = self._ids.get(alloc)
        if rid is None:
            self._next_id += 1
            rid = self._ids[alloc] = self._next_id
        return rid

    def record(self, fn, args, kwargs, out, step):
        """An outermost instruction of a profiled instance ran (from its liveness count): its record."""
        name = fn.__name__
        module = fn.__module__.rsplit(".", 1)[-1]
        written = set()
        tiles = []
        roles = {}

        def collect(v, kw=None):
            if isinstance(v, NkiTensor):
                tiles.append(v)
                if kw is not None:
                    roles.setdefault(id(v), kw)
                if kw in _WRITTEN_KWARGS:
                    written.add(id(v))
            elif isinstance(v, (list, tuple)):
                for x in v:
                    collect(x)
            elif isinstance(v, dict):
                for x in v.values():
                    collect(x)

        for a in args:
            collect(a)
        for k, v in (kwargs or {}).items():
            collect(v, k)
        if name in _WRITES_FIRST_ARG and args and isinstance(args[0], NkiTensor):
            written.add(id(args[0]))
        outs = []
        if isinstance(out, NkiTensor):
            outs = [out]
        elif isinstance(out, (list, tuple)):
            outs = [o for o in out if isinstance(o, NkiTensor)]
        arg_ids = {id(t) for t in tiles}
        for o in outs:
            written.add(id(o))
            if id(o) not in arg_ids:
                tiles.append(o)
        seen = set()
        accesses = []
        for t in tiles:
            if id(t) in seen:
                continue
            seen.add(id(t))
            accesses.append(self._access(t, id(t) in written, roles.get(id(t))))
        options = {}
        for k in ("engine", "perf_mode", "is_transpose", "transpose_x", "reduce_res", "accumulate"):
            if kwargs and k in kwargs:
                options[k] = kwargs[k] if k != "reduce_res" else True
        kind = name
        if module == "ops" and name == "unary":
            kind = "unary:" + _unary_name(args[0]) if args else name
            name = _unary_name(args[0]) if args else name
        elif module == "ops" and name == "binary":
            f = args[0] if args else None
            name = (kwargs or {}).get("what") or getattr(f, "__name__", "binary")
        elif module == "language" and getattr(fn, "_unary", None) is not None:
            kind = "unary:" + name
        prefix = {"language": "nl.", "isa": "nisa.", "ops": "", "tensor": ""}.get(module, "")
        if module == "language" and name.startswith("_loop_reduce"):
            name = "loop_reduce"
        if module == "tensor" and name == "assign":
            name = "tile assignment"
        if module == "ops" and name == "update":
            name = "in-place update"
        label = name if name.startswith("nl.") or not prefix else prefix + name
        self.records.append(Record(label, (module, kind), accesses, options, kernel_site(),
                                   self.instance, step))

    def _access(self, t, write, role=None):
        alloc = t._alloc
        root = alloc.owner if alloc.owner is not None else alloc
        dtype = t.dtype
        isz = _dt.itemsize(dtype)
        shape = tuple(t.shape)
        n = int(math.prod(shape)) if shape else 1
        box, run, inner = self._geometry_of(t, root, isz)
        # the partitions (rows, in HBM) the view spans: for a tile with block axes before its
        # partition axis (nl.par_dim) that is not its first dimension
        parts = max(1, min(box[1] - box[0], n))
        return Access(self._root_id(root), root.buffer, dtype, isz, n, parts, box, run, write, inner, role)

    def _geometry_of(self, t, root, isz):
        """(box, contiguous run in bytes, innermost stride in bytes) of view ``t`` in ``root``'s storage."""
        rdata = root.data
        rshape = tuple(rdata.shape)
        par = root.par_axis if root.buffer.on_chip else 0
        risz = rdata.itemsize
        P = int(rshape[par]) if rshape else 1
        inner = int(math.prod(rshape[par + 1:])) * risz if rshape else risz
        if t._arr is not None:
            off_b = t._arr.__array_interface__["data"][0] - rdata.__array_interface__["data"][0]
            strides = tuple(int(s) for s in t._arr.strides)
            key = (rshape, par, risz, tuple(t._arr.shape), off_b, strides, isz)
            g = self._geometry.get(key)
            if g is None:
                g = self._geometry[key] = _strided_geometry(tuple(t._arr.shape), off_b, strides, isz, P, inner)
            return g
        keys = t._key
        scale = t._alloc.data.itemsize
        return _gathered_geometry(keys, scale, P, inner, isz)


def _meta(alloc):
    """What the lowering needs to know about a buffer: shape, NKI dtype, memory, storage dtype."""
    return (tuple(alloc.data.shape), alloc.dtype, alloc.buffer, alloc.data.dtype)


def _strided_geometry(shape, off_b, strides, isz, P, inner):
    """Region of a strided view: partitions [p0, p1), bytes [f0, f1) within a partition."""
    span = inner * P
    blk, rem = divmod(off_b, span)
    p0, f0 = divmod(rem, inner)
    f0 += blk * inner
    plo = phi = p0
    flo = fhi = f0
    for n, s in zip(shape, strides):
        if n <= 1:
            continue
        ext = (n - 1) * s
        if s % span == 0 and span:
            d = (ext // span) * inner
            flo, fhi = flo + min(0, d), fhi + max(0, d)
        elif s % inner == 0:
            d = ext // inner
            plo, phi = plo + min(0, d), phi + max(0, d)
        else:
            flo, fhi = flo + min(0, ext), fhi + max(0, ext)
    box = (max(0, plo), min(P, phi + 1), max(0, flo), fhi + isz)
    run = isz
    expected = isz
    inner_stride = isz
    for n, s in reversed(list(zip(shape, strides))):
        if n == 1:
            continue
        inner_stride = abs(s) if inner_stride == isz and s != isz else inner_stride
        if s == expected:
            run = expected * n
            expected = run
        else:
            break
    return box, min(run, inner), inner_stride


def _gathered_geometry(keys, scale, P, inner, isz):
    """Region of an index-grid view: partitions from the extreme elements, the bytes within a
    partition from the first and last rows of the grid (index grids are affine, so every row
    covers the same span), the contiguous run from the first row."""
    k = np.asarray(keys)
    if k.size == 0:
        return (0, 0, 0, 0), isz, isz
    span = inner * P
    lo, hi = int(k.min()) * scale, int(k.max()) * scale
    if lo // span == hi // span:
        p0, p1 = (lo % span) // inner, (hi % span) // inner + 1
    else:
        p0, p1 = 0, P
    rows = k.reshape(-1, k.shape[-1]) if k.ndim else k.reshape(1, 1)
    edge = np.concatenate([rows[0], rows[-1]]).astype(np.int64) * scale
    free = (edge // span) * inner + edge % inner
    box = (p0, p1, int(free.min()), int(free.max()) + isz)
    run = isz
    inner_stride = isz
    if rows.shape[1] > 1:
        d = np.diff(rows[0]).astype(np.int64) * scale
        if (d == isz).all():
            run = isz * rows.shape[1]
        else:
            inner_stride = int(np.abs(d).max())
    return box, min(run, inner), inner_stride
