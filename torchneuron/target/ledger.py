"""The twin's accounts: modelled device time by operator, engine and bound, compiles,
and the two clocks that place each launch on the modelled timeline.

The host clock advances by the host's work between device operators (measured
here, ``twin.py``); the device clock by the launches. A launch starts when both
the device is free and the host has issued it, so a device that waits for the
host shows as the bound "host"; an operator whose result the host reads (an
``.item()``, a copy to the CPU) makes the host wait for the device.
"""
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
    fused_ops: int = 0         # operators that joined the launch before them (eager_fusion.py)
    eager_compiles: int = 0
    graph_compiles: int = 0
    compile_s: float = 0.0
    graph_rejections: int = 0
    host_s: float = 0.0        # the host's work between device operators
    host_clock: float = 0.0    # when the host issues its next launch
    device_clock: float = 0.0  # when the device is free
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def host(self, seconds: float) -> None:
        """The host worked ``seconds`` before issuing its next device operator."""
        with self.lock:
            self.host_s += seconds
            self.host_clock += seconds

    def sync(self) -> None:
        """The host waits for the device (it reads a result)."""
        with self.lock:
            self.host_clock = max(self.host_clock, self.device_clock)

    def align(self) -> None:
        """The start of a window: the host and the device start it together."""
        with self.lock:
            self.host_clock = self.device_clock = max(self.host_clock, self.device_clock)

    def settle(self) -> None:
        """The end of a window: the step lasts until both the device and the host are done."""
        with self.lock:
            if self.host_clock > self.device_clock:
                self.bound_s["host"] += self.host_clock - self.device_clock
                self.device_clock = self.host_clock

    def charge(self, name: str, cost: OpCost, joined: bool = False) -> float:
        """Charges one launch, or an operator that joined the launch before it; returns
        when it starts on the modelled timeline."""
        with self.lock:
            start = max(self.device_clock, self.host_clock)
            if start > self.device_clock:
                self.bound_s["host"] += start - self.device_clock
            self.device_clock = start + cost.seconds
            t = self.ops[name]
            t.count += 1
            t.seconds += cost.seconds
            t.flops += cost.flops
            t.bytes += cost.bytes
            if joined:
                self.fused_ops += 1
            else:
                self.launches += 1
            # The busy part counts for the engine (and bound) that sets it, the launch apart.
            busy = cost.busy_s
            self.engine_s[cost.engine] += busy
            self.bound_s[bound_of(cost.engine)] += busy
            self.bound_s["launch"] += cost.launch_s
            t.bound_s[cost.bound] += cost.seconds
            return start

    def compiled(self, seconds: float, graph: bool) -> None:
        with self.lock:
            if graph:
                self.graph_compiles += 1
            else:
                self.eager_compiles += 1
            self.compile_s += seconds

    @property
    def device_s(self) -> float:
        """The device timeline's length: launches, and the waits for the host between them."""
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
        for attr in ("launches", "fused_ops", "eager_compiles", "graph_compiles", "compile_s", "graph_rejections",
                     "host_s"):
            setattr(d, attr, getattr(now, attr) - getattr(before, attr))
        return d

    def as_dict(self, top: int = 10) -> dict:
        """JSON-ready: totals, the breakdowns, and the ``top`` operators by modelled time."""
        device = self.device_s
        ops = sorted(self.ops.items(), key=lambda kv: -kv[1].seconds)
        return {
            "device_s": device,
            "launches": self.launches,
            "fused_ops": self.fused_ops,
            "bound_s": dict(self.bound_s),
            "engine_s": dict(self.engine_s),
            "eager_compiles": self.eager_compiles,
            "graph_compiles": self.graph_compiles,
            "compile_s": self.compile_s,
            "host_s": self.host_s,
            "top_ops": [
                {"op": k, "count": t.count, "seconds": t.seconds, "share": t.seconds / device if device else 0.0,
                 "bound": max(t.bound_s, key=t.bound_s.get) if t.bound_s else "", "flops": t.flops, "bytes": t.bytes}
                for k, t in ops[:top]],
        }
