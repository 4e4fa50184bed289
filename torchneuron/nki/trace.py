"""Trace cache: a kernel's instructions are recorded once per signature and replayed.

An NKI kernel's Python sees shapes, dtypes, the grid and its non-tensor
arguments, never tile values.  So the sequence of instructions one launch
executes -- with every index expression, access pattern, mask and buffer
allocation already resolved, and every limit already checked -- is a function
of that signature.  The first launch of a signature interprets the kernel and
records that sequence as a ``Program``; later launches replay the program on
the new arrays without running the kernel's Python.

Recording works at the level of kernel-visible instructions: every public
function of ``nki.language`` / ``nki.isa`` (and tile arithmetic) is wrapped by
``instruction``.  While recording (the instruction recorder, recorder.py), an
outermost instruction call is stored as
(function, arguments) with each tile argument replaced by a ``View``: which
buffer (a slot) and which elements of it (whole / offset+strides / flat index
array).  Buffers get a slot when an instruction first returns them; kernel
arguments are the first slots.  Replay calls the same functions on views
rebuilt over the new buffers, so the arithmetic, rounding and engine state
(PSUM accumulation groups, accumulation registers, random generators) are
exactly those of interpretation.  At its first replay a program is also
lowered, if it can be, into closures that do only the NumPy work of each
step (the ``lower`` package); later replays run those.

What makes a trace unreplayable is detected while recording, and the
signature is then always interpreted (``Kernel.cache_info()`` says why):

* the kernel reads tile values into Python (``tile.read()`` and friends) or
  writes/allocates outside an instruction -- its control flow could depend on
  data, or the effect would be lost;
* an instruction is given a tile that no instruction of this launch made
  (e.g. a tensor kept from another launch);
* the kernel launches another kernel;
* an argument is not hashable, so there is no key.
"""
from __future__ import annotations

import os
import threading

import numpy as np

from .context import InstanceState, running
from .errors import NKIError
from .tensor import NkiTensor

_UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def enabled(flag=None) -> bool:
    """Is the trace cache on?  ``flag`` (the jit option) wins over TORCHNEURON_NKI_TRACE_CACHE."""
    if flag is not None:
        return bool(flag)
    return os.environ.get("TORCHNEURON_NKI_TRACE_CACHE", "1").lower() not in ("0", "false", "no", "off")


# ------------------------------------------------------------------ views
_WHOLE, _STRIDED, _GATHER = 0, 1, 2


class View:
    """A tile argument of a recorded step: which elements of which buffer slot."""

    __slots__ = ("slot", "kind", "shape", "offset", "strides", "key", "oob", "par", "mask")

    def __init__(self, slot, t):
        self.slot, self.par, self.mask = slot, t._par, t._mask
        self.key = self.oob = self.shape = self.offset = self.strides = None
        if t._arr is not None and t._arr is t._alloc.data:
            self.kind = _WHOLE
        elif t._arr is not None:
            self.kind = _STRIDED
            off, strides = t._offset_strides()
            isz = t._alloc.data.itemsize
            self.shape, self.offset, self.strides = t._arr.shape, off * isz, tuple(s * isz for s in strides)
        else:
            self.kind, self.key, self.oob = _GATHER, t._key, t._oob

    def make(self, allocs):
        alloc = allocs[self.slot]
        if self.kind == _WHOLE:
            return NkiTensor(alloc, alloc.data, None, None, self.par, self.mask)
        if self.kind == _GATHER:
            return NkiTensor(alloc, None, self.key, self.oob, self.par, self.mask)
        data = alloc.data
        # an ndarray over the storage's buffer (through a same-size unsigned
        # view, since ml_dtypes types have no buffer format): much cheaper
        # than as_strided, same memory
        u = _UINT_OF_SIZE[data.itemsize]
        arr = np.ndarray(self.shape, u, data.view(u), self.offset, self.strides).view(data.dtype)
        return NkiTensor(alloc, arr, None, None, self.par, self.mask)


def _make(template, allocs, memo):
    if isinstance(template, View):
        t = memo.get(id(template))
        if t is None:
            t = memo[id(template)] = template.make(allocs)
        return t
    if isinstance(template, _Nested):
        return template.make(allocs, memo)
    return template


class _Nested:
    """A list/tuple/dict argument holding tiles."""

    __slots__ = ("kind", "items")

    def __init__(self, kind, items):
        self.kind, self.items = kind, items

    def make(self, allocs, memo):
        if self.kind is dict:
            return {k: _make(v, allocs, memo) for k, v in self.items}
        return self.kind(_make(v, allocs, memo) for v in self.items)


# ------------------------------------------------------------------ steps
class Step:
    """One recorded instruction call."""

    __slots__ = ("fn", "args", "kwargs", "dyn_args", "dyn_kwargs", "binds", "frees", "location")

    def __init__(self, fn, args, kwargs, binds, location):
        self.fn, self.binds, self.location = fn, binds, location
        self.args, self.kwargs = args, kwargs
        self.dyn_args = [i for i, a in enumerate(args) if isinstance(a, (View, _Nested))]
        self.dyn_kwargs = [k for k, a in kwargs.items() if isinstance(a, (View, _Nested))]
        self.frees = ()

    def run(self, allocs):
        memo = {}
        args, kwargs = self.args, self.kwargs
        if self.dyn_args:
            args = list(args)
            for i in self.dyn_args:
                args[i] = _make(args[i], allocs, memo)
        if self.dyn_kwargs:
            kwargs = dict(kwargs)
            for k in self.dyn_kwargs:
                kwargs[k] = _make(kwargs[k], allocs, memo)
        out = self.fn(*args, **kwargs)
        for path, slot in self.binds:
            v = out
            for p in path:
                v = v[p]
            allocs[slot] = v._alloc
        for slot in self.frees:
            allocs[slot] = None

    def slots_used(self):
        used = []

        def walk(v):
            if isinstance(v, View):
                used.append(v.slot)
            elif isinstance(v, _Nested):
                for x in v.items:
                    walk(x[1] if v.kind is dict else x)
        for a in self.args:
            walk(a)
        for a in self.kwargs.values():
            walk(a)
        return used


class Program:
    """The recorded instructions of one launch signature: per grid point, a list of steps."""

    def __init__(self, n_inputs, n_slots, instances, result, slot_meta=None):
        self.n_inputs, self.n_slots = n_inputs, n_slots
        self.slot_meta = slot_meta or {}
        self.fast = None  # lower.FastProgram, False if not lowerable, None until the first replay (lower.lowered)
        self.fast_declined = None
        self.instances = instances  # [(program_id, [Step])]
        self.result = result
        self.steps = sum(len(s) for _, s in instances)
        # Free each buffer after its last use, as interpretation would when the
        # kernel drops its last reference; result buffers stay.
        last = {}
        kept = set()
        _walk_views(result, lambda v: kept.add(v.slot))
        for _, steps in instances:
            for step in steps:
                for slot in step.slots_used():
                    last[slot] = step
                for _, slot in step.binds:
                    last.setdefault(slot, step)
        frees = {}
        for slot, step in last.items():
            if slot not in kept and slot >= n_inputs:
                frees.setdefault(id(step), []).append(slot)
        for _, steps in instances:
            for step in steps:
                step.frees = tuple(frees.get(id(step), ()))

    def replay(self, launch, inputs):
        """Run the steps on new input tensors (in argument order); returns the kernel's result.
        (``lower.replay`` runs the lowered form instead where there is one.)"""
        allocs = [t._alloc for t in inputs] + [None] * (self.n_slots - self.n_inputs)
        for pid, steps in self.instances:
            with running(InstanceState(launch, pid)):
                for step in steps:
                    try:
                        step.run(allocs)
                    except NKIError as e:
                        # errors name the kernel line that issued the instruction
                        e.relocate(step.location)
                        raise
        return _make_result(self.result, allocs)


def _walk_views(v, f):
    if isinstance(v, View):
        f(v)
    elif isinstance(v, _Nested):
        for x in v.items:
            _walk_views(x[1] if v.kind is dict else x, f)


def _make_result(template, allocs):
    return _make(template, allocs, {})


# ------------------------------------------------------------------- cache
def _value_key(v):
    """Hashable description of one kernel argument; raises TypeError if there is none."""
    if isinstance(v, np.ndarray):
        return ("array", v.shape, v.dtype)  # (not dtype.name: slow for ml_dtypes types)
    if isinstance(v, (list, tuple)):
        return (type(v).__name__,) + tuple(_value_key(x) for x in v)
    if isinstance(v, (float, np.floating)):
        return (type(v), float(v).hex())  # 0.0 and -0.0 are different constants
    hash(v)
    return (type(v), v)


class TraceCache:
    """Programs of one kernel by signature, with counters for introspection."""

    def __init__(self, flag=None):
        self.flag = flag  # the jit option; None follows the environment
        self._lock = threading.Lock()
        self._programs = {}
        self._unreplayable = {}
        self.traces = self.replays = self.interpreted = 0

    def enabled(self):
        return enabled(self.flag)

    @staticmethod
    def key(grid, launch, args, kwargs):
        try:
            return (grid, launch.target, launch.debug, tuple(_value_key(a) for a in args),
                    tuple((k, _value_key(v)) for k, v in kwargs.items()))
        except TypeError:
            return None

    def lookup(self, key):
        """Program for ``key``; False if the signature must be interpreted; None if unknown."""
        if key is None:
            return False
        prog = self._programs.get(key)
        if prog is not None:
            return prog
        return False if key in self._unreplayable else None

    def store(self, key, program, reason):
        with self._lock:
            if program is not None:
                self._programs[key] = program
            else:
                self._unreplayable[key] = reason

    def count(self, what):
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)

    def info(self):
        progs = list(self._programs.values())
        return {"signatures": len(progs), "traces": self.traces, "replays": self.replays,
                "interpreted": self.interpreted, "unreplayable": sorted(set(self._unreplayable.values())),
                "lowered": sum(1 for p in progs if p.fast),
                "not_lowered": sorted({p.fast_declined for p in progs if p.fast is False})}

    def clear(self):
        with self._lock:
            self._programs.clear()
            self._unreplayable.clear()
            self.traces = self.replays = self.interpreted = 0

