"""The performance model's schedule: instruction records run on the machine's engines.

Every engine executes its own instructions in program order, and an instruction
starts when its engine is free and the instructions it depends on (overlapping
reads and writes of the same buffer region) have finished; the DMA queues share
their bandwidth (``_Bandwidth``).  The model's latency is the time the last
instruction finishes.
"""
from __future__ import annotations

import bisect

from .machine import Buffer, Machine
from .perf_costs import ENGINES, cost_of
from .perf_report import Report


class _Entry:
    __slots__ = ("box", "end", "done", "engine")

    def __init__(self, box, end, done, engine):
        self.box, self.end, self.done, self.engine = box, end, done, engine


def _overlaps(a, b):
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


def _inside(a, b):
    """Box a lies within box b."""
    return b[0] <= a[0] and a[1] <= b[1] and b[2] <= a[2] and a[3] <= b[3]


class _Bandwidth:
    """The DMA queues' shared bandwidth.  A transfer uses the bandwidth left free by the transfers
    issued before it, from when it may start until its bytes have moved, in as many pieces as the
    free time comes in: DMAs are spread over 16 queues, so a transfer waiting for its data does not
    hold back later, independent ones (the compute engines, unlike this, run in program order)."""

    def __init__(self):
        self.starts = []   # sorted, disjoint busy intervals [starts[i], ends[i])
        self.ends = []

    def place(self, t, length):
        """Occupy ``length`` ns of free bandwidth from ``t`` on; returns (first start, last end)."""
        starts, ends = self.starts, self.ends
        i = bisect.bisect_right(ends, t)
        if i < len(starts) and starts[i] <= t:
            t = ends[i]
            i += 1
        first = None
        left = length
        cur = t
        pieces = []
        while left > 0:
            gap_end = starts[i] if i < len(starts) else float("inf")
            take = min(left, gap_end - cur)
            if take > 0:
                if first is None:
                    first = cur
                pieces.append((cur, cur + take))
                left -= take
                cur += take
            if left > 0:
                cur = ends[i]
                i += 1
        if first is None:
            first = cur
        for a, b in pieces:
            self._occupy(a, b)
        return first, cur

    def _occupy(self, a, b):
        starts, ends = self.starts, self.ends
        i = bisect.bisect_left(starts, a)
        starts.insert(i, a)
        ends.insert(i, b)
        if i > 0 and ends[i - 1] >= a:          # merge with the previous interval
            ends[i - 1] = max(ends[i - 1], b)
            del starts[i], ends[i]
            i -= 1
        while i + 1 < len(starts) and starts[i + 1] <= ends[i]:
            ends[i] = max(ends[i], ends[i + 1])
            del starts[i + 1], ends[i + 1]


class _Engines:
    """The engines' clocks and what they did: when each compute engine is next free, the DMA
    queues' bandwidth, busy time and instruction counts, matmul work, HBM traffic, the events."""

    def __init__(self):
        self.free = dict.fromkeys(ENGINES, 0.0)
        self.dma = _Bandwidth()
        self.busy = dict.fromkeys(ENGINES, 0.0)
        self.counts = dict.fromkeys(ENGINES, 0)
        self.flops = self.ideal = 0.0
        self.hbm = 0
        self.events = []

    def run(self, rec, c, eng, ready):
        """Run ``rec`` (cost ``c``) on engine ``eng`` from ``ready`` on; returns (start, end, done)."""
        if eng == "dma":
            start, end = self.dma.place(ready, c.occupancy)
            end = max(end, start + c.busy)
        else:
            start = max(ready, self.free[eng])
            self.free[eng] = start + c.occupancy
            end = start + c.busy
        done = end + c.latency
        self.busy[eng] += c.occupancy
        self.counts[eng] += 1
        self.flops += c.flops
        self.ideal += c.ideal
        self.hbm += c.hbm_bytes
        self.events.append({"engine": eng, "start": start, "end": end, "ready": done, "name": rec.name,
                            "source": f"{rec.site[0]}:{rec.site[1]}", "function": rec.site[2],
                            "instance": rec.instance, "step": rec.step})
        return start, end, done


def _written_by_producer(rec, i, last_use):
    """An instruction result assigned into a tile (``t[...] = nl.exp(x)``) or accumulated into
    PSUM (``psum += nc_matmul(...)``) and used nowhere else is written there by the instruction
    that produced it: no copy, no vector add; ``t[...] += x`` assigns the updated region back
    onto itself: nothing moves."""
    src = [a for a in rec.accesses if not a.write]
    dst = [a for a in rec.accesses if a.write]
    fused = (src and src[0].buffer.on_chip and last_use.get(src[0].root) == i
             and (rec.kind[1] == "assign" or (dst and dst[0].buffer is Buffer.psum
                                               and src[0].buffer is Buffer.psum)))
    return bool(fused or (rec.kind[1] == "assign" and src and dst and src[0].root == dst[0].root
                          and src[0].box == dst[0].box))


def _ready(rec, eng, state):
    """When ``rec`` may start on ``eng``: once the writes its accesses overlap (and, for its
    writes, the reads they overlap) are done, or only ended on ``eng``, which runs in order."""
    ready = 0.0
    for a in rec.accesses:
        st = state.get(a.root)
        if st is None:
            continue
        writes, reads = st
        box = a.box
        for wbox, e in writes.items():
            if _overlaps(box, wbox):
                t = e.done if (not a.write or e.engine != eng) else e.end
                if t > ready:
                    ready = t
        if a.write:
            for rbox, by_engine in reads.items():
                if _overlaps(box, rbox):
                    for e in by_engine.values():
                        t = e.end if e.engine == eng else e.done
                        if t > ready:
                            ready = t
    return ready


def _note_accesses(rec, state, end, done, eng):
    """``rec``'s accesses, ended at ``end`` and done at ``done``, become what later accesses of
    their regions wait for."""
    for a in rec.accesses:
        st = state.get(a.root)
        if st is None:
            st = state[a.root] = ({}, {})
        writes, reads = st
        entry = _Entry(a.box, end, done, eng)
        box = a.box
        if a.write:
            # later accesses of what this write covers depend on it, which orders them after
            # the covered writes and reads too: those entries can go
            for b in [b for b in writes if _inside(b, box)]:
                del writes[b]
            for b in [b for b in reads if _inside(b, box)]:
                del reads[b]
            writes[box] = entry
        else:
            by_engine = reads.get(box)
            if by_engine is None:
                reads[box] = {eng: entry}
            else:
                prev = by_engine.get(eng)
                if prev is None or prev.done <= done:
                    by_engine[eng] = entry


def schedule(records, machine: Machine, kernel_name="", lives=None) -> Report:
    """Run the records on the machine's engines (see the module docstring)."""
    engines = _Engines()
    state: dict = {}   # root -> ({box: write entry}, {box: {engine: read entry}})
    last_use = {}
    for i, rec in enumerate(records):
        for a in rec.accesses:
            last_use[a.root] = i
    times = {}   # (instance, step) -> (start, done)
    end_time = 0.0
    for i, rec in enumerate(records):
        c = cost_of(rec, machine)
        eng = c.engine
        if eng != "none" and rec.kind[1] in ("assign", "update") and _written_by_producer(rec, i, last_use):
            eng = "none"
        ready = _ready(rec, eng, state)
        if eng == "none":
            start = end = done = ready
        else:
            start, end, done = engines.run(rec, c, eng, ready)
        times[(rec.instance, rec.step)] = (start, done)
        if done > end_time:
            end_time = done
        _note_accesses(rec, state, end, done, eng)
    engines.events.sort(key=lambda e: (e["start"], ENGINES.index(e["engine"])))
    report = Report(machine, end_time, engines.busy, engines.counts, engines.flops, engines.ideal, engines.hbm,
                    engines.events, kernel_name)
    report.occupancy = _occupancy(lives or (), times, machine)
    return report


def _occupancy(lives, times, machine):
    """[(t_ns, sbuf_bytes, psum_bytes)]: the on-chip bytes live over the modelled time (all partitions)."""
    changes = []
    for pid, live in lives:
        for tile in live.allocs:
            born = times.get((pid, tile.born))
            dead = times.get((pid, tile.last_use))
            if born is None or dead is None:
                continue
            nbytes = tile.footprint * machine.partitions
            sbuf = tile.buffer is Buffer.sbuf
            changes.append((born[0], nbytes if sbuf else 0, 0 if sbuf else nbytes))
            changes.append((max(dead[1], born[0]), -nbytes if sbuf else 0, 0 if sbuf else -nbytes))
    changes.sort(key=lambda c: (c[0], c[1] + c[2] > 0))  # at equal times, frees first
    out = [(0.0, 0, 0)]
    sb = ps = 0
    for t, ds, dp in changes:
        sb += ds
        ps += dp
        if out[-1][0] == t:
            out[-1] = (t, sb, ps)
        else:
            out.append((t, sb, ps))
    return out
