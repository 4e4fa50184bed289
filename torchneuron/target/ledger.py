"""The twin's accounts: modelled device time by operator, engine and bound, and compiles."""
from __future__ import annotations

import copy
import threading
from collections import defaultdict
from dataclasses import dataclass, field

from .roofline import OpCost, bound_of


@dataclass
class OpTotals:
    count: int = 0
    seconds: float = 0.0
    flops: int = 0
    bytes: int = 0
    bound_s: dict = field(default_factory=lambda: defaultdict(float))


@dataclass
class Ledger:
    """What the program would have cost on the target so far."""

    ops: dict = field(default_factory=lambda: defaultdict(OpTotals))  # operator or graph -> totals
    engine_s: dict = field(default_factory=lambda: defaultdict(float))  # busiest engine's time, by engine
    bound_s: dict = field(default_factory=lambda: defaultdict(float))   # compute / memory / launch
    launches: int = 0
    eager_compiles: int = 0
    graph_compiles: int = 0
    compile_s: float = 0.0
    graph_rejections: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def charge(self, name: str, cost: OpCost) -> None:
        with self.lock:
            t = self.ops[name]
            t.count += 1
            t.seconds += cost.seconds
            t.flops += cost.flops
            t.bytes += cost.bytes
            self.launches += 1
            # The busy part counts for the engine (and bound) that sets it, the launch apart.
            busy = cost.busy_s
            self.engine_s[cost.engine] += busy
            self.bound_s[bound_of(cost.engine)] += busy
            self.bound_s["launch"] += cost.launch_s
            t.bound_s[cost.bound] += cost.seconds

    def compiled(self, seconds: float, graph: bool) -> None:
        with self.lock:
            if graph:
                self.graph_compiles += 1
            else:
                self.eager_compiles += 1
            self.compile_s += seconds

    @property
    def device_s(self) -> float:
        return sum(self.bound_s.values())

    def snapshot(self) -> "Ledger":
        with self.lock:
            other = copy.copy(self)
            other.ops = defaultdict(OpTotals, {k: copy.deepcopy(v) for k, v in self.ops.items()})
            other.engine_s = defaultdict(float, self.engine_s)
            other.bound_s = defaultdict(float, self.bound_s)
            other.lock = threading.Lock()
            return other

    def since(self, before: "Ledger") -> "Ledger":
        """What was charged after ``before`` (a snapshot of this ledger)."""
        now = self.snapshot()
        d = Ledger()
        for k, t in now.ops.items():
            b = before.ops.get(k, OpTotals())
            if t.count > b.count:
                dt = d.ops[k]
                dt.count, dt.seconds = t.count - b.count, t.seconds - b.seconds
                dt.flops, dt.bytes = t.flops - b.flops, t.bytes - b.bytes
                for bound, s in t.bound_s.items():
                    dt.bound_s[bound] = s - b.bound_s.get(bound, 0.0)
        for attr in ("engine_s", "bound_s"):
            mine, theirs = getattr(now, attr), getattr(before, attr)
            for k, v in mine.items():
                getattr(d, attr)[k] = v - theirs.get(k, 0.0)
        for attr in ("launches", "eager_compiles", "graph_compiles", "compile_s", "graph_rejections"):
            setattr(d, attr, getattr(now, attr) - getattr(before, attr))
        return d

    def as_dict(self, top: int = 10) -> dict:
        """JSON-ready: totals, the breakdowns, and the ``top`` operators by modelled time."""
        device = self.device_s
        ops = sorted(self.ops.items(), key=lambda kv: -kv[1].seconds)
        return {
            "device_s": device,
            "launches": self.launches,
            "bound_s": dict(self.bound_s),
            "engine_s": dict(self.engine_s),
            "eager_compiles": self.eager_compiles,
            "graph_compiles": self.graph_compiles,
            "compile_s": self.compile_s,
            "top_ops": [
                {"op": k, "count": t.count, "seconds": t.seconds, "share": t.seconds / device if device else 0.0,
                 "bound": max(t.bound_s, key=t.bound_s.get) if t.bound_s else "", "flops": t.flops, "bytes": t.bytes}
                for k, t in ops[:top]],
        }
