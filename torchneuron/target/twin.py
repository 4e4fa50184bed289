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
import warnings
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from . import figures
from .ledger import Ledger
from .roofline import OpCost, op_cost
from .wide_types import TargetWarning, WideTypes

_LIBRARY_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules["torchneuron"]))
_local = threading.local()


def warn_at(msg: str, site: str) -> None:
    """A TargetWarning attributed to the user's line ``site`` ("file:line")."""
    filename, _, line = site.rpartition(":")
    warnings.warn_explicit(msg, TargetWarning, filename or site, int(line) if line.isdigit() else 0,
                           module=os.path.splitext(os.path.basename(filename))[0] or None)


def call_site() -> str:
    """``file:line`` of the innermost frame outside torch and torchneuron."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_LIBRARY_DIRS) and not name.startswith("<frozen"):
            rel = os.path.relpath(name) if not name.startswith("<") else name
            return f"{name if rel.startswith('..') else rel}:{f.f_lineno}"
        f = f.f_back
    return "?"


def _signature(func, args, kwargs):
    leaves = tree_flatten((args, kwargs))[0]
    return (func,) + tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor)
                           else x if isinstance(x, (int, bool, str, torch.dtype)) or x is None
                           else type(x).__name__ for x in leaves)


def _is_shape(x) -> bool:
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], torch.dtype)


def _changing(signatures) -> list:
    """What differs between signatures of one operator: ("dimension d of tensor argument i", values)
    per tensor dimension, ("argument k", values) per integer argument."""
    sigs = [s[1:] for s in signatures]
    if len({len(s) for s in sigs}) != 1:
        return []
    out, tensor_index = [], 0
    for k in range(len(sigs[0])):
        column = [s[k] for s in sigs]
        if all(_is_shape(c) for c in column):
            ranks = {len(c[0]) for c in column}
            if len(ranks) == 1:
                for d in range(ranks.pop()):
                    values = sorted({c[0][d] for c in column})
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
        self.ledger = Ledger()
        self.wide = WideTypes(wide, target) if wide != "off" else None
        self._costs: dict = {}
        self._by_site = defaultdict(set)  # (operator, site) -> its signatures
        self._churn_reported = set()
        self.churn: list = []              # the shape-churn reports

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
        results = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.device.type == "neuron"]
        if not results and not any(isinstance(t, torch.Tensor) and t.device.type == "neuron"
                                   for t in tree_flatten((args, kwargs))[0]):
            return out
        name = func.name()
        try:
            sig = _signature(func, args, kwargs)
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
                    self._note_signature(name, sig)
        if cost:
            self.ledger.charge(name, cost)
        if results:
            self._check_capacity(name, results[0].device)
        if self.wide is not None and results:  # in-place and out= operators return what they wrote
            self.wide.after(name, results, call_site)
        return out

    def _check_capacity(self, name: str, device: torch.device) -> None:
        allocated = torch.neuron.memory_allocated(device)
        if allocated > self.core.hbm_bytes:
            gib = 1 << 30
            raise torch.OutOfMemoryError(
                f"{name} on {device}: {allocated / gib:.2f} GiB allocated would exceed the "
                f"{self.core.hbm_bytes / gib:.0f} GiB of HBM of one logical core of {self.core.machine.device} "
                f"(LNC={self.core.lnc}); the target runs out of memory here (TORCHNEURON_TARGET)")

    def _note_signature(self, name: str, sig) -> None:
        site = call_site()
        sigs = self._by_site[(name, site)]
        sigs.add(sig)
        if len(sigs) < figures.CHURN_SIGNATURES or (name, site) in self._churn_reported:
            return
        self._churn_reported.add((name, site))
        changes = _changing(sigs)
        what = "; ".join(f"{where} takes {', '.join(map(str, v[:6]))}{', ...' if len(v) > 6 else ''}"
                         for where, v in changes[:3]) or "its arguments change"
        msg = (f"shape churn: {name} at {site} has run with {len(sigs)} signatures, each a compile on "
               f"{self.core.key} (modelled {figures.EAGER_COMPILE_S:g} s each): {what}. Pad or bucket the "
               f"changing size so that one shape repeats.")
        self.churn.append({"op": name, "site": site, "signatures": len(sigs),
                           "changes": [{"where": w, "values": v} for w, v in changes]})
        warn_at(msg, site)

    # -- compiled graphs
    def charge_graph(self, name: str, cost: OpCost) -> None:
        self.ledger.charge(name, cost)


class graph_launch:
    """While a compiled graph runs, its operators are not charged one by one."""

    def __enter__(self):
        _local.in_graph = getattr(_local, "in_graph", 0) + 1

    def __exit__(self, *exc):
        _local.in_graph -= 1
