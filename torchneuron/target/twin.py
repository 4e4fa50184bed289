"""The Trainium twin: every operator the device runs, seen as the target would run it.

A ``TorchDispatchMode`` sees each operator after autograd and composite
decomposition, the operators a backend receives, which are what TorchNeuron's
eager mode compiles and launches one by one. For each one on ``neuron``:

* its signature (operator, argument shapes and dtypes, integer arguments): a
  new one is a compile on the target, with a modelled compile time; a Python
  line that keeps making new signatures of an operator is shape churn, reported
  once with the dimension that changes;
* its modelled duration on the target (``roofline.py``), charged to the ledger as
  a launch of its own or as part of the launch before it (``eager_fusion.py``);
* the 64-bit rule on its results (``wide_types.py``);
* the host's work since the previous device operator: this thread's CPU time
  outside the handler (so the emulator's own work and the waits for it do not
  count), less the mode's own entry cost measured at enable. An operator whose
  result the host reads makes the host wait for the modelled device
  (``ledger.py``).

Operators inside a compiled graph's launch are not charged one by one: the
graph is (``Twin.graph_launch``). The mode is pushed on the thread that enables the
twin and on every thread started after that (``adopt_new_threads``); PyTorch
carries it into the autograd engine's threads. Threads started before are not
seen (docs/target.md).
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections import Counter, defaultdict

import torch
import torch.autograd.profiler as _profiler
from torch.utils._python_dispatch import TorchDispatchMode

from . import eager_fusion, figures
from .ledger import Ledger
from .roofline import OpCost, op_cost
from .wide_types import WideTypes, warn_at

_LIBRARY_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules["torchneuron"]))
_local = threading.local()
# Launches of one profiled run kept for its modelled timeline (the totals count them all).
TIMELINE_LAUNCHES = 200_000
# Operators whose result's size depends on the values: the host waits for them to finish.
_DATA_DEPENDENT_SHAPE = frozenset("nonzero masked_select _unique2 unique_dim unique_consecutive".split())


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
        self.timeline: list = []  # the profiled run's launches: (name, start, seconds, bound, engine)
        self._entry_s = 0.0  # thread CPU time the mode adds to an operator before its handler runs
        self._calibrating = False  # while measure_entry_cost runs: operators pass through
        self.enabled = True  # False after release_threads: threads that hold the mode pass through
        self._previous_profile = None  # the thread-start hook adopt_new_threads replaced

    # -- threads
    def adopt_new_threads(self) -> None:
        """Pushes the mode on each thread started from now on, at its first Python call
        (``threading.setprofile``'s hook runs there, once, and hands over to any hook set
        before). Until ``release_threads``."""
        previous = threading.getprofile()

        def adopt(frame, event, arg):
            sys.setprofile(previous)
            if self.enabled:
                torch.utils._python_dispatch._push_mode(self)
            if previous is not None:
                return previous(frame, event, arg)

        self._previous_profile = previous
        threading.setprofile(adopt)

    def release_threads(self) -> None:
        """No more adoption; the threads that hold the mode pass their operators through."""
        self.enabled = False
        threading.setprofile(self._previous_profile)

    def measure_entry_cost(self, calls: int = 300) -> None:
        """Measures the mode's own cost per operator (with the mode pushed), so that the
        host's work between operators leaves it out."""
        x, op = torch.empty(1), torch.ops.aten.alias.default

        def per_call():
            t = time.thread_time()
            for _ in range(calls):
                op(x)
            return (time.thread_time() - t) / calls

        self._calibrating = True
        try:
            with_mode = min(per_call() for _ in range(3))
            with torch.utils._python_dispatch._disable_current_modes():
                without = min(per_call() for _ in range(3))
        finally:
            self._calibrating = False
        self._entry_s = max(0.0, with_mode - without)

    def _host_worked(self, now: float) -> None:
        """Charges the host's work on this thread since its previous device operator."""
        mark = getattr(_local, "host_mark", None)
        if mark is not None:
            self.ledger.host(max(0.0, now - mark - self._entry_s))

    def _host_until_now(self) -> None:
        """Charges this thread's host work up to now, and counts on from here."""
        now = time.thread_time()
        self._host_worked(now)
        _local.host_mark = now

    def settle(self) -> None:
        """The end of a window of the account: the host's work up to now is charged, and
        the window lasts until the host and the device are both done."""
        self._host_until_now()
        self.ledger.settle()

    def restart_host(self) -> None:
        """The start of a window of the account: this thread's host work counts from here,
        and the host and the device start together."""
        _local.host_mark = time.thread_time()
        self.ledger.align()

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile compiles under the twin (it is off while Dynamo traces) and the
        # graph is charged as one launch (charge_graph), as the target runs it.
        return True

    # -- the dispatch hook
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        entered = time.thread_time()
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self._calibrating or not self.enabled or getattr(_local, "in_graph", 0):
            return out
        done = time.thread_time()
        out_leaves = _leaves(out, [])
        results = [t for t in out_leaves if isinstance(t, torch.Tensor) and t.device.type == "neuron"]
        leaves = _leaves((args, kwargs), [])
        if not results and not any(isinstance(t, torch.Tensor) and t.device.type == "neuron" for t in leaves):
            if hasattr(_local, "host_mark"):  # a host operator is host work; the mode's time around it is not
                _local.host_mark += time.thread_time() - done + self._entry_s
            return out
        if _profiler._is_profiler_enabled != self._profiling:
            self._profiling = _profiler._is_profiler_enabled
            if self._profiling:
                self.restart_host()
                entered = _local.host_mark
                self.profile_start, self.profile_end = self.ledger.snapshot(), None
                self.timeline = []
            else:
                self.profile_end = self.ledger.snapshot()
        self._host_worked(entered)
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
            cost, joined = eager_fusion.join(cost, leaves, results, self.core)
            self.charge(name, cost, joined=joined)
        if len(results) < len([x for x in out_leaves if x is not None]) or \
                func._overloadpacket.__name__ in _DATA_DEPENDENT_SHAPE:
            self.ledger.sync()  # a value or a size the host reads
            eager_fusion.end_run()
        if results:
            self._check_dtypes(name, results)
            self._check_capacity(name, results)
        if self.wide is not None and results:  # in-place and out= operators return what they wrote
            self.wide.after(name, results, call_site)
        _local.host_mark = time.thread_time()
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

    def charge(self, name: str, cost: OpCost, joined: bool = False) -> None:
        """Charges one launch (an operator, a compiled graph or a kernel), or an operator
        that ``joined`` the previous launch (``eager_fusion.py``), to the ledger, and to the
        profiled run's modelled timeline while a profiler records."""
        start = self.ledger.charge(name, cost, joined)
        if self._profiling and len(self.timeline) < TIMELINE_LAUNCHES:
            self.timeline.append((name, start, cost.seconds, cost.bound, cost.engine))

    # -- compiled graphs
    @contextlib.contextmanager
    def launching(self):
        """A launch the dispatch hook does not see (a compiled graph, an NKI kernel): the
        host's work up to it is charged, and its own time here is not the host's."""
        self._host_until_now()
        eager_fusion.end_run()
        try:
            yield
        finally:
            _local.host_mark = time.thread_time()

    @contextlib.contextmanager
    def graph_launch(self, name: str, cost: OpCost):
        """One launch of a compiled graph, charged as one task: while it runs, its
        operators are not charged one by one."""
        with self.launching():
            self.charge(name, cost)
            _local.in_graph = getattr(_local, "in_graph", 0) + 1
            try:
                yield
            finally:
                _local.in_graph -= 1
