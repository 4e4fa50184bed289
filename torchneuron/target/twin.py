"""The Trainium twin: every operator the device runs, seen as the target would run it.

A ``TorchDispatchMode`` sees each operator after autograd and composite
decomposition, the operators a backend receives, which are what TorchNeuron's
eager mode compiles and launches one by one. For each one on ``neuron``:

* its signature (operator, argument shapes and dtypes, integer arguments): a
  new one is a compile on the target, with a modelled compile time; a Python
  line that keeps making new signatures of an operator is shape churn, reported
  once with the dimension that changes;
* its modelled duration on the target (``roofline.py``), charged to the ledger;
* the 64-bit rule on its results (``wide_types.py``).

Operators inside a compiled graph's launch are not charged one by one: the
graph is (``charge_graph``). The mode is pushed on the thread that enables the
twin; PyTorch carries it into the autograd engine's threads. Work queued from
other threads is not seen (docs/target.md).
"""
from __future__ import annotations

import os
import sys
import threading
from collections import Counter, defaultdict

import torch
import torch.autograd.profiler as _profiler
from torch.utils._python_dispatch import TorchDispatchMode

from . import figures
from .ledger import Ledger
from .roofline import OpCost, op_cost
from .wide_types import WideTypes, warn_at

_LIBRARY_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules["torchneuron"]))
_local = threading.local()
# Launches of one profiled run kept for its modelled timeline (the totals count them all).
TIMELINE_LAUNCHES = 200_000


# The frames between a mode's __torch_dispatch__ and the operator's caller when nothing else is
# there (the decorator that keeps Dynamo out of modes).
_DISPATCH_WRAPPERS = tuple(os.path.join(os.path.dirname(torch.__file__), f) for f in ("_dynamo/eval_frame.py",
                                                                                    "_compile.py"))


def _user_frame():
    """The innermost frame outside torch and torchneuron, and whether the operator was
    called from it directly (no Python frame of a library between them)."""
    f = sys._getframe(3)  # above _user_frame, _execution and __torch_dispatch__
    direct = True
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_LIBRARY_DIRS) and not name.startswith("<frozen"):
            return f, direct
        direct = direct and name in _DISPATCH_WRAPPERS
        f = f.f_back
    return None, False


def _site(frame) -> str:
    if frame is None:
        return "?"
    name = frame.f_code.co_filename
    rel = os.path.relpath(name) if not name.startswith("<") else name
    return f"{name if rel.startswith('..') else rel}:{frame.f_lineno}"


def call_site() -> str:
    """``file:line`` of the innermost frame outside torch and torchneuron."""
    f = sys._getframe(1)
    while f is not None and (f.f_code.co_filename.startswith(_LIBRARY_DIRS) or
                             f.f_code.co_filename.startswith("<frozen")):
        f = f.f_back
    return _site(f)


def _leaves(x, out: list) -> list:
    """The leaves of an operator's arguments or results (tuples, lists, dicts), as
    pytree's tree_flatten gives them for these containers, at a fraction of its cost."""
    if isinstance(x, (tuple, list)):
        for y in x:
            _leaves(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            _leaves(y, out)
    else:
        out.append(x)
    return out


def _signature(func, leaves):
    return (func,) + tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor)
                           else x if isinstance(x, (int, bool, str, torch.dtype)) or x is None
                           else type(x).__name__ for x in leaves)


def _is_shape(x) -> bool:
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], torch.dtype)


def _changing(signatures) -> list:
    """What differs between signatures of one operator: ("dimension d of tensor argument i", values)
    per tensor dimension, ("argument k", values) per integer argument."""
    sigs = [s[1:] for s in signatures]
    # Signatures with optional arguments present or not: compare those of the most common form.
    lengths = Counter(len(s) for s in sigs)
    sigs = [s for s in sigs if len(s) == lengths.most_common(1)[0][0]]
    out, tensor_index = [], 0
    for k in range(len(sigs[0])):
        column = [s[k] for s in sigs]
        if all(_is_shape(c) for c in column):
            rank = Counter(len(c[0]) for c in column).most_common(1)[0][0]
            for d in range(rank):
                values = sorted({c[0][d] for c in column if len(c[0]) == rank})
                if len(values) > 1:
                    out.append((f"dimension {d} of tensor argument {tensor_index}", values))
            tensor_index += 1
        elif all(isinstance(c, int) for c in column):
            values = sorted(set(column))
            if len(values) > 1:
                out.append((f"argument {k}", values))
    return out


class Twin(TorchDispatchMode):
    def __init__(self, target: str, lnc: int = 2, wide: str = "warn"):
        super().__init__()
        self.core = figures.logical_core(target, lnc)
        self._dtypes = frozenset(getattr(torch, name) for name in figures.DTYPES[target] if hasattr(torch, name))
        self.ledger = Ledger()
        self.wide = WideTypes(wide, target) if wide != "off" else None
        self._costs: dict = {}
        # (operator, site) -> its signatures, and the executions of the site that made them
        self._by_site = defaultdict(lambda: (set(), set()))
        self._churn_reported = set()
        self.churn: list = []              # the shape-churn reports
        self._headroom: dict = {}          # device -> bytes left on the target at the last reading
        self._profiling = False
        # The ledger when the latest profiler run began and ended (None: not yet).
        self.profile_start: Ledger | None = None
        self.profile_end: Ledger | None = None
        self.timeline: list = []  # the profiled run's launches: (name, seconds, bound, engine)

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile compiles under the twin (it is off while Dynamo traces) and the
        # graph is charged as one launch (charge_graph), as the target runs it.
        return True

    # -- the dispatch hook
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if getattr(_local, "in_graph", 0):
            return out
        results = [t for t in _leaves(out, []) if isinstance(t, torch.Tensor) and t.device.type == "neuron"]
        leaves = _leaves((args, kwargs), [])
        if not results and not any(isinstance(t, torch.Tensor) and t.device.type == "neuron" for t in leaves):
            return out
        if _profiler._is_profiler_enabled != self._profiling:
            self._profiling = _profiler._is_profiler_enabled
            if self._profiling:
                self.profile_start, self.profile_end = self.ledger.snapshot(), None
                self.timeline = []
            else:
                self.profile_end = self.ledger.snapshot()
        name = func.name()
        execution = self._execution()
        try:
            sig = _signature(func, leaves)
            hash(sig)
        except TypeError:
            sig = None
        cost = self._costs.get(sig) if sig is not None else None
        if cost is None:
            cost = op_cost(func, args, kwargs, out, self.core) or False
            if sig is not None:
                self._costs[sig] = cost
                if cost:
                    self.ledger.compiled(figures.EAGER_COMPILE_S, graph=False)
                    self._note_signature(name, sig, execution)
        if cost:
            self.charge(name, cost)
        if results:
            self._check_dtypes(name, results)
            self._check_capacity(name, results)
        if self.wide is not None and results:  # in-place and out= operators return what they wrote
            self.wide.after(name, results, call_site)
        return out

    def _check_dtypes(self, name: str, results) -> None:
        for t in results:
            if t.dtype not in self._dtypes:
                raise TypeError(
                    f"{name} made a {str(t.dtype).replace('torch.', '')} tensor on {t.device}: "
                    f"{self.core.machine.device}'s NeuronCores have no such type (TORCHNEURON_TARGET="
                    f"{self.core.key}; docs/target.md lists the types they have)")

    def _check_capacity(self, name: str, results) -> None:
        # The device's allocated bytes are read only when the results made since the last
        # reading could have used up the headroom it left (reading them each time costs more
        # than the operator).
        made = sum(t.untyped_storage().nbytes() for t in results)
        device = results[0].device
        headroom = self._headroom.get(device, 0) - made
        if headroom >= 0:
            self._headroom[device] = headroom
            return
        allocated = torch.neuron.memory_allocated(device)
        self._headroom[device] = self.core.hbm_bytes - allocated
        if allocated > self.core.hbm_bytes:
            gib = 1 << 30
            raise torch.OutOfMemoryError(
                f"{name} on {device}: {allocated / gib:.2f} GiB allocated would exceed the "
                f"{self.core.hbm_bytes / gib:.0f} GiB of HBM of one logical core of {self.core.machine.device} "
                f"(LNC={self.core.lnc}); the target runs out of memory here (TORCHNEURON_TARGET)")

    def _execution(self):
        """(site, execution) of the operator being dispatched. One execution is a run of
        operators from one Python line, in this thread, with no operator from another line
        between: a loop inside a library (an optimizer over its parameters) stays one
        execution of the line that called it. An operator called from the line itself (no
        library frame between) is an execution of its own."""
        frame, direct = _user_frame()
        key = (id(frame), frame.f_lineno) if frame is not None else None
        if direct or key != getattr(_local, "run_key", None):
            _local.run_key = key
            _local.run = getattr(_local, "run", 0) + 1
        return frame, getattr(_local, "run", 0)

    def _note_signature(self, name: str, sig, execution) -> None:
        frame, run = execution
        site = _site(frame)
        sigs, runs = self._by_site[(name, site)]
        sigs.add(sig)
        runs.add(run)
        # Shape churn: new signatures in several executions of the line (not several at once,
        # as an optimizer's over its parameters), with a size that keeps taking new values (not
        # two phases, as a prompt and the tokens after it).
        if len(runs) < figures.CHURN_SIGNATURES or (name, site) in self._churn_reported:
            return
        changes = _changing(sigs)
        if not any(len(values) >= figures.CHURN_SIGNATURES for _, values in changes):
            return
        self._churn_reported.add((name, site))
        changes.sort(key=lambda c: -len(c[1]))
        what = "; ".join(f"{where} takes {', '.join(map(str, v[:6]))}{', ...' if len(v) > 6 else ''}"
                         for where, v in changes[:3])
        msg = (f"shape churn: {name} at {site} made new signatures in {len(runs)} separate runs of the line "
               f"({len(sigs)} signatures, each a compile on "
               f"{self.core.key}, modelled {figures.EAGER_COMPILE_S:g} s each): {what}. Pad or bucket the "
               f"changing size so that one shape repeats.")
        self.churn.append({"op": name, "site": site, "signatures": len(sigs),
                           "changes": [{"where": w, "values": v} for w, v in changes]})
        warn_at(msg, site)

    # -- compiled graphs
    def charge(self, name: str, cost: OpCost) -> None:
        """Charges one launch (an operator or a compiled graph) to the ledger, and to the
        profiled run's modelled timeline while a profiler records."""
        self.ledger.charge(name, cost)
        if self._profiling and len(self.timeline) < TIMELINE_LAUNCHES:
            self.timeline.append((name, cost.seconds, cost.bound, cost.engine))


class graph_launch:
    """While a compiled graph runs, its operators are not charged one by one."""

    def __enter__(self):
        _local.in_graph = getattr(_local, "in_graph", 0) + 1

    def __exit__(self, *exc):
        _local.in_graph -= 1
