"""A profiler trace as events, nested and linked: host ranges per thread,
device tasks per (device, stream), each task's launching operator.

Input is the chrome trace ``torch.profiler`` writes (``export_chrome_trace``):
host events as Kineto writes them (``cpu_op``, ``user_annotation``,
``python_function`` with ``with_stack=True``, ``[memory]`` instant events with
``profile_memory=True``) and device tasks as Kineto writes device activities:
``ph: "X"``, ``cat`` one of ``kernel``/``gpu_memcpy``/``gpu_memset``, ``pid`` the
device index, ``tid`` the stream, ``args`` with ``device``, ``stream``,
``correlation`` and ``External id`` (the launching operator's), plus the
emulator's own ``operator``, ``kind``, ``fused_members`` and ``queued_us``.
Optional: ``ac2g`` flow events (``s`` on the host, ``f`` on the task) and a
top-level ``neuronNkiKernels`` list (the NKI view); a true top-level
``neuronExplorerSyntheticDeviceRows`` marks made-up device rows (test helpers),
which the report then says. Every field is optional: a CPU-only trace gives a
host-only report.
"""
from __future__ import annotations

import bisect
from collections import defaultdict

from .python_frames import is_user_frame

# Device activity categories, as Kineto names its activity types.
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# Host ranges an operator launch can show as (CUDA's and PrivateUse1's runtime calls).
RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "privateuse1_runtime", "privateuse1_driver", "runtime")
# Host categories drawn as operator lanes and nested by time.
HOST_OP_CATS = ("cpu_op", "user_annotation") + RUNTIME_CATS


class HostEvent:
    """A host range: an operator, annotation, runtime call or Python frame."""
    __slots__ = ("index", "name", "cat", "pid", "tid", "ts", "end", "ext_id", "args",
                 "parent", "frame", "lane", "children_dur", "device_self", "device_total",
                 "tasks", "stack")

    def __init__(self, index, e):
        self.index = index
        self.name = str(e.get("name", ""))
        self.cat = e.get("cat", "")
        self.pid, self.tid = e.get("pid"), e.get("tid")
        self.ts = float(e.get("ts", 0.0))
        self.end = self.ts + max(float(e.get("dur", 0.0)), 0.0)
        self.args = e.get("args") or {}
        self.ext_id = self.args.get("External id")
        self.parent = None        # operators: the enclosing operator or annotation; frames: the caller
        self.frame = None         # operators: the innermost Python frame around it
        self.lane = 0             # operators: nesting depth among operators and annotations
        self.children_dur = 0.0   # time of directly nested operators
        self.device_self = 0.0    # device time of the tasks this range launched
        self.device_total = 0.0   # ... and of those its nested operators launched
        self.tasks = []           # task indices, launched here or below
        self.stack = None         # operators: Python frames around it, innermost first (interned id)

    @property
    def dur(self):
        return self.end - self.ts

    @property
    def is_frame(self):
        return self.cat == "python_function"


class Task:
    """A device task (a Kineto device activity)."""
    __slots__ = ("index", "name", "cat", "device", "stream", "ts", "end", "corr", "ext_id",
                 "kind", "operator", "fused_members", "queued", "op", "args")

    def __init__(self, index, e):
        args = e.get("args") or {}
        self.index = index
        self.name = str(e.get("name", ""))
        self.cat = e.get("cat", "")
        self.device = as_int(args.get("device"), as_int(e.get("pid"), 0))
        self.stream = as_int(args.get("stream"), as_int(e.get("tid"), 0))
        self.ts = float(e.get("ts", 0.0))
        self.end = self.ts + max(float(e.get("dur", 0.0)), 0.0)
        self.corr = args.get("correlation")
        self.ext_id = args.get("External id")
        kind = args.get("kind")
        if kind is None:
            is_copy = self.cat in ("gpu_memcpy", "gpu_memset") or self.name.startswith(("Memcpy", "Memset"))
            kind = "copy" if is_copy else "op"
        self.kind = str(kind)
        self.operator = args.get("operator")
        members = args.get("fused_members")
        self.fused_members = [str(m) for m in members] if isinstance(members, list) else None
        queued = args.get("queued_us")
        self.queued = float(queued) if isinstance(queued, (int, float)) else None
        self.op = None            # launching host operator (HostEvent)
        self.args = args

    @property
    def dur(self):
        return self.end - self.ts


# The longest a task can plausibly wait in its queue (us); beyond it an enqueue
# time is taken to be on another clock.
MAX_QUEUE_WAIT_US = 1e8


def _on_trace_clock(queued, ts, base_us):
    """An enqueue time on the clock of ts: as given, or as an absolute time from which
    Kineto's base time was not taken (Kineto shifts ts, not the arguments); None when
    neither is at or before the task's start."""
    if queued is None:
        return None
    for q in (queued, queued - base_us):
        if ts - MAX_QUEUE_WAIT_US <= q <= ts + 1e-3:
            return q
    return None


def as_int(value, default):
    """A trace field as an int; default when it is missing or not a number."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


class Trace:
    """The events of one trace, nested and linked: host ranges per thread, device
    tasks per (device, stream), each task's launching operator, memory events."""

    def __init__(self, trace: dict):
        self.raw = trace
        self.process_names, self.thread_names = {}, {}
        self.host, self.tasks, self.memory = [], [], []
        flow_starts = {}
        for e in trace.get("traceEvents") or []:
            if not isinstance(e, dict):
                continue
            ph, cat = e.get("ph"), e.get("cat", "")
            if ph == "M":
                args = e.get("args") or {}
                if e.get("name") == "process_name":
                    self.process_names[e.get("pid")] = str(args.get("name", ""))
                elif e.get("name") == "thread_name":
                    self.thread_names[(e.get("pid"), e.get("tid"))] = str(args.get("name", ""))
            elif ph == "X":
                if cat in DEVICE_CATS:
                    self.tasks.append(Task(len(self.tasks), e))
                elif cat in HOST_OP_CATS or cat == "python_function":
                    self.host.append(HostEvent(len(self.host), e))
            elif ph == "i" and e.get("name") == "[memory]":
                self.memory.append(e)
            elif ph == "s" and cat == "ac2g":
                flow_starts[e.get("id")] = e
        self.tasks.sort(key=lambda t: (t.ts, t.device, t.stream))
        base_us = float(trace.get("baseTimeNanoseconds") or 0) / 1000
        for i, t in enumerate(self.tasks):
            t.index = i
            t.queued = _on_trace_clock(t.queued, t.ts, base_us)
        self._nest()
        self._link_tasks(flow_starts)
        self.synthetic = bool(trace.get("neuronExplorerSyntheticDeviceRows"))

    def _nest(self):
        """Operators nest by time on each thread (the deepest range that contains one is
        its parent); Python frames by the caller ids the profiler writes, else by time.
        Each operator's frame is the innermost Python frame that contains it."""
        self.ops_by_thread, self.frames_by_thread = defaultdict(list), defaultdict(list)
        for ev in self.host:
            (self.frames_by_thread if ev.is_frame else self.ops_by_thread)[(ev.pid, ev.tid)].append(ev)
        self.threads = sorted(set(self.ops_by_thread) | set(self.frames_by_thread), key=str)
        for evs in self.ops_by_thread.values():
            _nest_by_time(evs)
            for ev in evs:
                if ev.parent is not None:
                    ev.lane = ev.parent.lane + 1
                    ev.parent.children_dur += ev.dur
        by_id = {ev.args["Python id"]: ev for ev in self.host if ev.is_frame and "Python id" in ev.args}
        for evs in self.frames_by_thread.values():
            if all("Python id" in ev.args for ev in evs):
                evs.sort(key=lambda ev: (ev.ts, -ev.dur, ev.index))
                for ev in evs:
                    ev.parent = by_id.get(ev.args.get("Python parent id"))
            else:
                _nest_by_time(evs)
        self.op_starts = {k: [ev.ts for ev in evs] for k, evs in self.ops_by_thread.items()}
        self.frame_starts = {k: [ev.ts for ev in evs] for k, evs in self.frames_by_thread.items()}
        # Stacks: the frames around each operator, innermost first, interned.
        self.stacks, stack_ids = [], {}
        for ev in self.host:
            if ev.is_frame:
                continue
            ev.frame = self.frame_at((ev.pid, ev.tid), ev.ts, ev.end)
            frames, f = [], ev.frame
            while f is not None:
                frames.append(f.name)
                f = f.parent
            key = tuple(frames)
            if key not in stack_ids:
                stack_ids[key] = len(self.stacks)
                self.stacks.append(key)
            ev.stack = stack_ids[key]

    def op_at(self, pid, tid, t):
        """The innermost operator or annotation on thread (pid, tid) running at time t, or None."""
        return _innermost(self.ops_by_thread.get((pid, tid)), self.op_starts.get((pid, tid)), t, t)

    def frame_at(self, key, t0, t1=None):
        """The innermost Python frame on thread key that contains [t0, t1], or None."""
        return _innermost(self.frames_by_thread.get(key), self.frame_starts.get(key), t0,
                          t0 if t1 is None else t1)

    def _link_tasks(self, flow_starts):
        """Each task's launching operator: by its External id, else by its flow's start."""
        by_ext = {}
        for ev in self.host:
            if ev.cat in ("cpu_op", "user_annotation") and ev.ext_id is not None:
                by_ext.setdefault(ev.ext_id, ev)
        for t in self.tasks:
            op = by_ext.get(t.ext_id) if t.ext_id is not None else None
            if op is None and t.corr is not None and t.corr in flow_starts:
                s = flow_starts[t.corr]
                ev = self.op_at(s.get("pid"), s.get("tid"), float(s.get("ts", 0.0)))
                if ev is not None and ev.cat in RUNTIME_CATS:
                    op = by_ext.get(ev.ext_id) or ev.parent
                else:
                    op = ev
            t.op = op
            if op is None:
                continue
            op.device_self += t.dur
            p = op
            while p is not None:
                p.device_total += t.dur
                p.tasks.append(t.index)
                p = p.parent

    def user_frame(self, ev):
        """The innermost frame of the user's code around host range ev, or None."""
        f = ev.parent if ev.is_frame else ev.frame
        while f is not None:
            if is_user_frame(f.name):
                return f.name
            f = f.parent
        return None


# Two timestamps closer than this (us) are equal: Kineto writes nanoseconds.
TIME_EPS = 1e-3


def _nest_by_time(evs):
    """Sorts the ranges of one thread by start and gives each the deepest range that
    contains it as parent. A range that only overlaps another is not its child."""
    evs.sort(key=lambda ev: (ev.ts, -ev.dur, ev.index))
    stack = []
    for ev in evs:
        while stack and stack[-1].end <= ev.ts:
            stack.pop()
        ev.parent = next((p for p in reversed(stack) if p.end >= ev.end - TIME_EPS), None)
        stack.append(ev)


def _innermost(evs, starts, t0, t1):
    """The innermost of evs (sorted by start, nested by parent) that contains [t0, t1]."""
    if not evs:
        return None
    i = bisect.bisect_right(starts, t0 + TIME_EPS) - 1
    ev = evs[i] if i >= 0 else None
    while ev is not None and ev.end < t1 - TIME_EPS:
        ev = ev.parent
    return ev


def op_ancestors(ev):
    """The operators and annotations around operator ev, innermost first."""
    p = ev.parent
    while p is not None:
        yield p
        p = p.parent
