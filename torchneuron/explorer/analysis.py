"""Where the time went, from a PyTorch profiler trace: the explorer's analysis.

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
host-only report. docs/explorer.md defines each figure.

``analyze(trace)`` returns one JSON-serialisable dict; the renderer embeds it
in the report as is, and the tests check its figures. Times are microseconds
on the trace's clock, except in the NKI part (nanoseconds, as given).
"""
from __future__ import annotations

import bisect
import functools
import gzip
import importlib.metadata
import json
import os
import re
import sys
from collections import defaultdict

# Device activity categories, as Kineto names its activity types.
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# Host ranges an operator launch can show as (CUDA's and PrivateUse1's runtime calls).
RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "privateuse1_runtime", "privateuse1_driver", "runtime")
# Host categories drawn as operator lanes and nested by time.
HOST_OP_CATS = ("cpu_op", "user_annotation") + RUNTIME_CATS
TASK_KINDS = ("op", "fused", "compiled", "nki", "copy")
# c10::DeviceType values that can appear in "[memory]" events.
DEVICE_TYPE_NAMES = {0: "cpu", 1: "cuda", 20: "neuron"}
NKI_ENGINES = ("Tensor", "Vector", "Scalar", "GpSimd", "DMA")

# Operators that read device values, so can wait for the device, with the Python
# call users know them by. Outermost wins: aten::item runs aten::_local_scalar_dense.
SYNC_OPS = {
    "aten::item": ".item()",
    "aten::_local_scalar_dense": ".item()",
    "aten::is_nonzero": "bool(tensor)",
    "aten::equal": "torch.equal()",
    "aten::nonzero": "nonzero()",
    "aten::_unique2": "unique()",
    "aten::unique_consecutive": "unique_consecutive()",
    "aten::masked_select": "masked_select()",
}
SYNC_WORD = re.compile(r"synchroni[sz]e", re.IGNORECASE)
# Names a device-to-host copy task (.cpu(), .tolist()).
DTOH_WORD = re.compile(r"DtoH|device.to.host", re.IGNORECASE)

IDLE_CAUSES = ("queued", "sync", "host_bound", "empty_queue")
IDLE_CAUSE_LABELS = {
    "queued": "queued, not started",
    "sync": "waiting in a synchronising call",
    "host_bound": "host-bound issue",
    "empty_queue": "empty queue",
}
# A recommendation is made when its share of the resource at stake reaches this.
RECOMMENDATION_MIN_SHARE = 0.05

PY_FRAME = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<func>.*)$")
BUILTIN_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>$")


# -- loading ------------------------------------------------------------------

# Framework traces in a profile output directory: torch_neuronx.profiling's
# (``<dir>/<host>_pid_<pid>/<timestamp>/trace.json``), the name TorchNeuron's
# troubleshooting guide gives one, and tensorboard_trace_handler's.
TRACE_NAMES = re.compile(r"^(trace\.json|neuron_framework_trace_rank_\d+\.json|.*\.pt\.trace\.json)(\.gz)?$")


def find_traces(directory) -> list:
    """The framework traces under `directory`, sorted by path."""
    found = []
    for root, _, files in os.walk(os.fspath(directory)):
        found += [os.path.join(root, f) for f in files if TRACE_NAMES.match(f)]
    return sorted(found)


def resolve_trace(source) -> str:
    """A trace file's path from a file or a profile output directory holding
    exactly one trace (several: name one; the error lists them)."""
    path = os.fspath(source)
    if not os.path.isdir(path):
        return path
    traces = find_traces(path)
    if not traces:
        raise FileNotFoundError(f"no profiler trace (trace.json, neuron_framework_trace_rank_<N>.json or "
                                f"*.pt.trace.json) under the directory {path}")
    if len(traces) > 1:
        listed = "\n  ".join(traces)
        raise ValueError(f"the directory {path} holds {len(traces)} traces (one per rank and per trace-ready "
                         f"call); name one of them, or the directory that holds it:\n  {listed}")
    return traces[0]


def load_trace(source) -> dict:
    """A trace dict from a path (``.json`` or ``.json.gz``, or a directory
    holding one such trace) or a dict (returned as is)."""
    if isinstance(source, dict):
        return source
    path = resolve_trace(source)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


# -- intervals: sorted lists of disjoint [start, end] -------------------------

def merge_intervals(intervals) -> list:
    out = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return out


def total_length(intervals) -> float:
    return sum(e - s for s, e in intervals)


def intersect_intervals(a, b) -> list:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append([s, e])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract_intervals(a, b) -> list:
    out, j = [], 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k, cur = j, s
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append([cur, b[k][0]])
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append([cur, e])
    return out


# -- events -------------------------------------------------------------------

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
        self.device = _as_int(args.get("device"), _as_int(e.get("pid"), 0))
        self.stream = _as_int(args.get("stream"), _as_int(e.get("tid"), 0))
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


def _as_int(value, default):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


# -- Python frames --------------------------------------------------------------

def _library_roots() -> frozenset:
    """Top-level names of code that is not the user's: the standard library and installed packages."""
    roots = set(sys.stdlib_module_names) | {"torch", "torchneuron", "torch_neuronx"}
    try:
        roots |= set(importlib.metadata.packages_distributions())
    except Exception:  # noqa: BLE001 - a broken environment only loses this refinement
        pass
    return frozenset(roots)


_LIBRARY_ROOTS = None


def parse_frame(name: str):
    """(file, line, function) of a python_function event's name, or None for built-ins.
    The line is where the function starts (the profiler records frames at their call)."""
    m = PY_FRAME.match(name)
    if not m:
        return None
    return m.group("file"), int(m.group("line")), m.group("func")


@functools.lru_cache(maxsize=None)
def is_user_frame(name: str) -> bool:
    """A frame of the user's own code: not built-in, not the standard library, not an installed package."""
    global _LIBRARY_ROOTS
    parsed = parse_frame(name)
    if parsed is None:
        return False
    path = parsed[0].replace("\\", "/")
    if path.startswith("<") or any(d in path for d in ("site-packages/", "dist-packages/", "/lib/python3")):
        return False
    if _LIBRARY_ROOTS is None:
        _LIBRARY_ROOTS = _library_roots()
    first = path.split("/")[0]
    return (first[:-3] if first.endswith(".py") else first) not in _LIBRARY_ROOTS


def frame_label(name: str) -> str:
    """A frame as "function (file:line)", built-ins without their object address."""
    parsed = parse_frame(name)
    if parsed is None:
        return BUILTIN_ADDRESS.sub(">", name)
    file, line, func = parsed
    return f"{func} ({file}:{line})"


# -- the trace as events ----------------------------------------------------------

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


# -- the analysis -------------------------------------------------------------------

def _window(tr: Trace):
    spans = [(ev.ts, ev.end) for ev in tr.host if ev.cat in HOST_OP_CATS]
    spans += [(t.ts, t.end) for t in tr.tasks]
    if not spans:
        spans = [(ev.ts, ev.end) for ev in tr.host]
    if not spans:
        return 0.0, 0.0
    return min(s for s, _ in spans), max(e for _, e in spans)


def _op_ancestors(ev):
    """The operators and annotations around operator ev, innermost first."""
    p = ev.parent
    while p is not None:
        yield p
        p = p.parent


def _launch_time(t):
    """When a task entered its queue: its own record, else its operator's start."""
    if t.queued is not None:
        return t.queued
    return t.op.ts if t.op is not None else t.ts


def _sync_calls(tr: Trace):
    """Outermost host calls that can wait for the device, each as (event, label, waited):
    operators that read device values (SYNC_OPS), anything named synchronize, and
    operators that return only after the copy task they launched finished. A call
    waited when a task queued before it started finished while the host was in it,
    or when it returned only after a task it launched finished."""
    candidates = {}
    for ev in tr.host:
        if ev.cat == "cpu_op" and ev.name in SYNC_OPS:
            candidates[ev.index] = SYNC_OPS[ev.name]
        elif SYNC_WORD.search(ev.name):
            candidates[ev.index] = "synchronize()"
    for t in tr.tasks:
        if t.op is not None and t.kind == "copy" and t.op.end >= t.end - TIME_EPS and t.op.index not in candidates:
            candidates[t.op.index] = ".cpu() / .to('cpu')" if DTOH_WORD.search(t.name) else "blocking copy"
    by_end = sorted(tr.tasks, key=lambda t: t.end)
    ends = [t.end for t in by_end]
    calls = []
    for index, label in candidates.items():
        ev = tr.host[index]
        if any(outer.index in candidates for outer in _outer(ev)):
            continue
        lo, hi = bisect.bisect_right(ends, ev.ts), bisect.bisect_right(ends, ev.end + TIME_EPS)
        waited = any(_launch_time(t) <= ev.ts + TIME_EPS for t in by_end[lo:hi])
        if not waited and not ev.is_frame:
            waited = any(tr.tasks[i].end <= ev.end + TIME_EPS for i in ev.tasks)
        calls.append((ev, label, waited))
    calls.sort(key=lambda c: c[0].ts)
    return calls


def _outer(ev):
    """The ranges around host range ev: enclosing operators, then Python frames."""
    p = ev
    while p.parent is not None:
        p = p.parent
        yield p
    f = p.parent if p.is_frame else p.frame
    while f is not None:
        yield f
        f = f.parent


def _idle_by_cause(busy, window, queued, sync, host_ops):
    idle = subtract_intervals([list(window)], busy) if window[1] > window[0] else []
    q = intersect_intervals(idle, queued)
    rest = subtract_intervals(idle, q)
    s = intersect_intervals(rest, sync)
    rest = subtract_intervals(rest, s)
    h = intersect_intervals(rest, host_ops)
    e = subtract_intervals(rest, h)
    return idle, {"queued": q, "sync": s, "host_bound": h, "empty_queue": e}


def _share(part, whole):
    return part / whole if whole > 0 else 0.0


def _pct(x):
    return f"{100.0 * x:.0f}%"


def _fmt_us(us):
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} us"


def _fmt_bytes(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _main_thread(tr: Trace):
    """The thread running the profiled Python program: the one with Python frames
    and the most operators."""
    def score(key):
        return (bool(tr.frames_by_thread.get(key)), len(tr.ops_by_thread.get(key, ())))
    return max(tr.threads, key=score, default=None)


def _python_at(tr: Trace, key, t):
    """The innermost user frame on thread key at time t, else the innermost frame, else None."""
    f = tr.frame_at(key, t) if key is not None else None
    innermost = f.name if f is not None else None
    while f is not None:
        if is_user_frame(f.name):
            return f.name
        f = f.parent
    return innermost


def _memory(tr: Trace, t0):
    """Per device (c10 device type, index): the allocator's counters over time, its
    peaks, its fragmentation (the share of peak reserved memory beyond the peak
    allocated) and each allocation with the operator and task that made it."""
    per_device = defaultdict(list)
    for e in tr.memory:
        args = e.get("args") or {}
        key = (_as_int(args.get("Device Type"), 0), _as_int(args.get("Device Id"), -1))
        per_device[key].append(e)
    devices = []
    for (dtype, dindex), events in sorted(per_device.items()):
        events.sort(key=lambda e: float(e.get("ts", 0.0)))
        label = DEVICE_TYPE_NAMES.get(dtype, f"device type {dtype}")
        if dtype != 0 and dindex >= 0:
            label += f":{dindex}"
        series, allocations, live = [], [], {}
        peak_alloc, peak_reserved, peak_t = 0, 0, None
        for e in events:
            args = e.get("args") or {}
            ts = float(e.get("ts", 0.0))
            allocated = _as_int(args.get("Total Allocated"), 0)
            reserved = _as_int(args.get("Total Reserved"), 0)
            nbytes = _as_int(args.get("Bytes"), 0)
            addr = args.get("Addr")
            series.append([round(ts - t0, 3), allocated, reserved])
            if allocated > peak_alloc:
                peak_alloc, peak_t = allocated, ts
            peak_reserved = max(peak_reserved, reserved)
            if nbytes > 0:
                op = tr.op_at(e.get("pid"), e.get("tid"), ts)
                while op is not None and op.cat in RUNTIME_CATS:
                    op = op.parent
                task = op.tasks[0] if op is not None and op.tasks else -1
                rec = {"t": round(ts - t0, 3), "end": None, "bytes": nbytes, "addr": addr,
                       "op": op.index if op is not None else -1, "task": task}
                allocations.append(rec)
                live[addr] = rec
            elif nbytes < 0 and addr in live:
                live.pop(addr)["end"] = round(ts - t0, 3)
        devices.append({
            "label": label, "device_type": dtype, "device_index": dindex,
            "peak_allocated": peak_alloc, "peak_reserved": peak_reserved,
            # Reserved memory never live at once: what the cache holds beyond the program's peak need.
            "fragmentation": _share(peak_reserved - peak_alloc, peak_reserved) if peak_reserved > peak_alloc else 0.0,
            "peak_allocated_t": round(peak_t - t0, 3) if peak_t is not None else None,
            "series": series, "allocations": allocations,
        })
    return devices


def _nki(trace: dict):
    """The NKI kernels' instruction traces, read tolerantly: missing fields take defaults."""
    kernels = []
    raw = trace.get("neuronNkiKernels")
    if not isinstance(raw, list):
        return kernels
    for k in raw:
        if not isinstance(k, dict):
            continue
        instructions = []
        for ins in k.get("instructions") or []:
            if not isinstance(ins, dict):
                continue
            try:
                start, end = float(ins.get("start_ns", 0)), float(ins.get("end_ns", 0))
            except (TypeError, ValueError):
                continue
            instructions.append({"engine": str(ins.get("engine", "?")), "name": str(ins.get("name", "")),
                                 "start_ns": start, "end_ns": max(end, start),
                                 "line": str(ins.get("line", ""))})
        engines = list(NKI_ENGINES) + sorted({i["engine"] for i in instructions} - set(NKI_ENGINES))
        busy = {}
        for eng in engines:
            iv = merge_intervals([[i["start_ns"], i["end_ns"]] for i in instructions if i["engine"] == eng])
            busy[eng] = total_length(iv)
        occupancy = []
        for o in k.get("occupancy") or []:
            if isinstance(o, dict):
                occupancy.append([float(o.get("t_ns", 0)), _as_int(o.get("sbuf_bytes"), 0),
                                  _as_int(o.get("psum_bytes"), 0)])
        occupancy.sort()
        span = max((i["end_ns"] for i in instructions), default=0.0) - min(
            (i["start_ns"] for i in instructions), default=0.0)
        kernels.append({
            "kernel": str(k.get("kernel", "kernel")), "source": k.get("source") if isinstance(k.get("source"), str) else "",
            "instructions": instructions, "engines": engines, "engine_busy_ns": busy, "span_ns": span,
            "occupancy": occupancy,
            "sbuf_capacity": _as_int(k.get("sbuf_capacity"), 0), "psum_capacity": _as_int(k.get("psum_capacity"), 0),
            "peak_sbuf": max((o[1] for o in occupancy), default=0),
            "peak_psum": max((o[2] for o in occupancy), default=0),
        })
    return kernels


def analyze(source) -> dict:
    """The report's data: summary figures, recommendations, timeline rows, operators,
    memory and NKI kernels, from a trace dict or path."""
    tr = Trace(load_trace(source))
    t0, t1 = _window(tr)
    window_us = t1 - t0
    strings, string_ids = [], {}

    def sid(s):
        if s not in string_ids:
            string_ids[s] = len(strings)
            strings.append(s)
        return string_ids[s]

    # Host state over time, shared by every core's idle classification.
    host_op_iv = merge_intervals([[ev.ts, ev.end] for ev in tr.host if ev.cat in ("cpu_op",) + RUNTIME_CATS])
    sync_calls = _sync_calls(tr)
    sync_iv = merge_intervals([[ev.ts, ev.end] for ev, _, waited in sync_calls if waited])
    main_key = _main_thread(tr)

    # -- per core ---------------------------------------------------------------
    cores, idle_parts = [], {c: [] for c in IDLE_CAUSES}
    by_device = defaultdict(list)
    for t in tr.tasks:
        by_device[t.device].append(t)
    total_idle = 0.0
    for device in sorted(by_device):
        tasks = by_device[device]
        busy = merge_intervals([[t.ts, t.end] for t in tasks])
        queued = merge_intervals([[t.queued, t.ts] for t in tasks if t.queued is not None and t.queued < t.ts])
        idle, causes = _idle_by_cause(busy, (t0, t1), queued, sync_iv, host_op_iv)
        idle_us = total_length(idle)
        total_idle += idle_us
        for c in IDLE_CAUSES:
            idle_parts[c].append(causes[c])
        streams = sorted({t.stream for t in tasks})
        cores.append({
            "device": device, "label": tr.process_names.get(device) or f"neuron:{device}",
            "busy_us": total_length(busy), "idle_us": idle_us, "window_us": window_us,
            "utilization": _share(total_length(busy), window_us), "tasks": len(tasks),
            "streams": streams,
            "idle": {c: total_length(causes[c]) for c in IDLE_CAUSES},
        })
    idle_totals = {c: sum(total_length(iv) for iv in idle_parts[c]) for c in IDLE_CAUSES}

    # Waiting idle per call site: the synchronising call and the user's frame around it.
    sites = {}
    for ev, label, waited in sync_calls:
        frame = tr.user_frame(ev)
        key = (label, ev.name, frame)
        site = sites.setdefault(key, {"label": label, "op": ev.name, "frame": frame,
                                      "frame_label": frame_label(frame) if frame else None,
                                      "calls": 0, "waited_calls": 0, "idle_us": 0.0, "host_us": 0.0})
        site["calls"] += 1
        site["host_us"] += ev.dur
        if waited:
            site["waited_calls"] += 1
            site["idle_us"] += sum(total_length(intersect_intervals(iv, [[ev.ts, ev.end]]))
                                   for iv in idle_parts["sync"])
    sync_sites = sorted(sites.values(), key=lambda s: (-s["idle_us"], -s["host_us"]))
    for s in sync_sites:
        s["share_of_idle"] = _share(s["idle_us"], total_idle)

    # Host-bound idle by the outermost operator the host was running (annotations aside).
    host_bound_ops = defaultdict(float)
    hb = [iv for parts in idle_parts["host_bound"] for iv in parts]
    top_ops = sorted((ev for ev in tr.host if ev.cat in ("cpu_op",) + RUNTIME_CATS
                      and not any(p.cat != "user_annotation" for p in _op_ancestors(ev))), key=lambda ev: ev.ts)
    hb_merged = sorted(hb)
    hb_ends = [e for _, e in hb_merged]
    for ev in top_ops:
        lo = bisect.bisect_left(hb_ends, ev.ts)
        for s, e in hb_merged[lo:]:
            if s >= ev.end:
                break
            host_bound_ops[ev.name] += max(0.0, min(e, ev.end) - max(s, ev.ts))
    # Empty-queue idle by the Python frame the main thread was in (at each gap's middle).
    empty_frames = defaultdict(float)
    for parts in idle_parts["empty_queue"]:
        for s, e in parts:
            frame = _python_at(tr, main_key, (s + e) / 2)
            empty_frames[frame_label(frame) if frame else "(outside Python frames)"] += e - s

    # -- host/device overlap --------------------------------------------------------
    device_busy = merge_intervals([[t.ts, t.end] for t in tr.tasks])
    host_active = subtract_intervals(host_op_iv, sync_iv)
    overlap_us = total_length(intersect_intervals(host_active, device_busy))
    overlap = {"host_active_us": total_length(host_active), "device_busy_us": total_length(device_busy),
               "overlap_us": overlap_us,
               "share_of_device_busy": _share(overlap_us, total_length(device_busy)),
               "share_of_host_active": _share(overlap_us, total_length(host_active))}

    # -- device time by operator, kind and fused group --------------------------------
    device_time_total = sum(t.dur for t in tr.tasks)
    by_launcher = {}
    for t in tr.tasks:
        name = t.op.name if t.op is not None else (str(t.operator) if t.operator else t.name)
        row = by_launcher.setdefault(name, {"name": name, "device_us": 0.0, "tasks": 0, "kinds": defaultdict(float)})
        row["device_us"] += t.dur
        row["tasks"] += 1
        row["kinds"][t.kind] += t.dur
    top_device_ops = sorted(by_launcher.values(), key=lambda r: -r["device_us"])[:15]
    for r in top_device_ops:
        r["share"] = _share(r["device_us"], device_time_total)
        r["kinds"] = dict(r["kinds"])
    kinds = {}
    for k in list(TASK_KINDS) + sorted({t.kind for t in tr.tasks} - set(TASK_KINDS)):
        us = sum(t.dur for t in tr.tasks if t.kind == k)
        n = sum(1 for t in tr.tasks if t.kind == k)
        kinds[k] = {"us": us, "tasks": n, "share": _share(us, device_time_total)}
    groups = {}
    for t in tr.tasks:
        if t.fused_members:
            key = tuple(t.fused_members)
            g = groups.setdefault(key, {"members": list(key), "us": 0.0, "tasks": 0})
            g["us"] += t.dur
            g["tasks"] += 1
    fused_groups = sorted(groups.values(), key=lambda g: -g["us"])[:15]

    # -- operators table ------------------------------------------------------------
    op_rows = {}
    for ev in tr.host:
        if ev.is_frame:
            continue
        row = op_rows.get(ev.name)
        if row is None:
            row = op_rows[ev.name] = {"name": ev.name, "cat": ev.cat, "calls": 0, "host_total_us": 0.0,
                                      "host_self_us": 0.0, "device_self_us": 0.0, "device_total_us": 0.0,
                                      "tasks": [], "events": [], "stacks": defaultdict(int)}
        row["calls"] += 1
        if not any(p.name == ev.name for p in _op_ancestors(ev)):
            row["host_total_us"] += ev.dur
            row["device_total_us"] += ev.device_total
            row["tasks"].extend(ev.tasks)
        row["host_self_us"] += max(0.0, ev.dur - ev.children_dur)
        row["device_self_us"] += ev.device_self
        row["events"].append(ev.index)
        row["stacks"][ev.stack] += 1
    operators = []
    for row in sorted(op_rows.values(), key=lambda r: (-r["device_total_us"], -r["host_total_us"])):
        stacks = sorted(row["stacks"].items(), key=lambda kv: -kv[1])[:5]
        row["stacks"] = [[s, n] for s, n in stacks if tr.stacks[s]]
        row["tasks"] = sorted(set(row["tasks"]))
        operators.append(row)

    # -- timeline rows ----------------------------------------------------------------
    host_rows, row_of_thread = [], {}
    for key in sorted(tr.threads, key=lambda k: (k != main_key, str(k))):
        evs = tr.ops_by_thread.get(key)
        if not evs:
            continue
        row_of_thread[key] = len(host_rows)
        host_rows.append({"pid": key[0], "tid": key[1],
                          "label": tr.thread_names.get(key) or f"thread {key[1]}",
                          "lanes": max(ev.lane for ev in evs) + 1})
    op_index = {}
    op_events = []
    for ev in tr.host:
        if ev.is_frame or (ev.pid, ev.tid) not in row_of_thread:
            continue
        op_index[ev.index] = len(op_events)
        op_events.append(ev)
    ops_table = [[row_of_thread[(ev.pid, ev.tid)], round(ev.ts - t0, 3), round(ev.dur, 3), sid(ev.name),
                  ev.lane, sid(ev.cat), ev.stack, ev.ext_id if isinstance(ev.ext_id, int) else -1]
                 for ev in op_events]
    stream_rows, row_of_stream = [], {}
    for t in tr.tasks:
        key = (t.device, t.stream)
        if key not in row_of_stream:
            row_of_stream[key] = None
    for key in sorted(row_of_stream):
        row_of_stream[key] = len(stream_rows)
        dev_label = tr.process_names.get(key[0]) or f"neuron:{key[0]}"
        stream_rows.append({"device": key[0], "stream": key[1],
                            "label": f"{dev_label} " + (tr.thread_names.get(key) or f"stream {key[1]}")})
    members_ids = {}
    fused_lists = []
    tasks_table = []
    for t in tr.tasks:
        mid = -1
        if t.fused_members:
            k = tuple(t.fused_members)
            if k not in members_ids:
                members_ids[k] = len(fused_lists)
                fused_lists.append([sid(m) for m in k])
            mid = members_ids[k]
        tasks_table.append([row_of_stream[(t.device, t.stream)], round(t.ts - t0, 3), round(t.dur, 3),
                            sid(t.name), sid(t.kind), op_index.get(t.op.index, -1) if t.op is not None else -1,
                            round(t.queued - t0, 3) if t.queued is not None else None, mid,
                            t.corr if isinstance(t.corr, int) else -1,
                            sid(str(t.operator)) if t.operator is not None else -1])
    for row in operators:
        row["events"] = [op_index[i] for i in row["events"] if i in op_index]

    memory = _memory(tr, t0)
    for dev in memory:
        for a in dev["allocations"]:
            a["op"] = op_index.get(a["op"], -1)

    summary = {
        "window_us": window_us, "t0": t0, "host_threads": len(host_rows), "host_ops": len(op_events),
        "device_tasks": len(tr.tasks), "has_device_rows": bool(tr.tasks), "synthetic_device_rows": tr.synthetic,
        "cores": cores, "idle_us": total_idle, "idle": idle_totals,
        "idle_share": {c: _share(idle_totals[c], total_idle) for c in IDLE_CAUSES},
        "sync_sites": sync_sites[:10],
        "host_bound_ops": sorted(([n, us] for n, us in host_bound_ops.items() if us > 0), key=lambda x: -x[1])[:10],
        "empty_queue_frames": sorted(([n, us] for n, us in empty_frames.items()), key=lambda x: -x[1])[:10],
        "overlap": overlap, "device_time_us": device_time_total,
        "top_device_ops": top_device_ops, "kinds": kinds, "fused_groups": fused_groups,
        "memory": [{k: v for k, v in d.items() if k not in ("series", "allocations")} for d in memory],
        "host_samples": _host_samples(tr.raw),
        # torch_neuronx.profiling's account of the capture: rank, modes, what was and was not produced.
        "neuron_profile": tr.raw.get("neuronProfile") if isinstance(tr.raw.get("neuronProfile"), dict) else None,
        "target": _target_model(tr.raw),
    }
    summary["recommendations"] = recommend(summary)
    return {
        "version": 1,
        "summary": summary,
        "strings": strings,
        "stacks": [[sid(frame_label(f)) for f in s] for s in tr.stacks],
        "stack_user": [[is_user_frame(f) for f in s] for s in tr.stacks],
        "host_rows": host_rows, "ops": ops_table,
        "stream_rows": stream_rows, "tasks": tasks_table, "fused_lists": fused_lists,
        "operators": operators, "memory": memory, "nki": _nki(tr.raw),
        "idle_labels": IDLE_CAUSE_LABELS,
    }


def _target_model(trace: dict):
    """The Trainium twin's account of the profiled work (top-level ``neuronTargetModel``,
    torchneuron.target), read tolerantly; None without one."""
    m = trace.get("neuronTargetModel")
    if not isinstance(m, dict):
        return None

    def number(d, k):
        try:
            return float(d.get(k) or 0.0)
        except (TypeError, ValueError):
            return 0.0

    def seconds_by(key):
        d = m.get(key)
        return {str(k): number(d, k) for k in d} if isinstance(d, dict) else {}

    ops = [{"op": str(o.get("op", "?")), "us": number(o, "seconds") * 1e6, "share": number(o, "share"),
            "bound": str(o.get("bound", "")), "count": _as_int(o.get("count"), 0)}
           for o in m.get("top_ops") or [] if isinstance(o, dict)]
    return {
        "target": str(m.get("target", "?")), "device": str(m.get("device", "")), "lnc": _as_int(m.get("lnc"), 0),
        "device_us": number(m, "device_s") * 1e6, "launches": _as_int(m.get("launches"), 0),
        "steps": _as_int(m.get("steps"), 0),
        "bound_us": {k: v * 1e6 for k, v in seconds_by("bound_s").items()},
        "engine_us": {k: v * 1e6 for k, v in seconds_by("engine_s").items()},
        "eager_compiles": _as_int(m.get("eager_compiles"), 0), "graph_compiles": _as_int(m.get("graph_compiles"), 0),
        "compile_s": number(m, "compile_s"), "top_ops": ops,
        "churn": [c for c in m.get("churn") or [] if isinstance(c, dict)],
        "wide_findings": _as_int(m.get("wide_findings"), 0),
        "assumptions": [str(v) for v in (m.get("assumptions") or {}).values()]
                       if isinstance(m.get("assumptions"), dict) else [],
    }


def _host_samples(trace: dict):
    """The host's CPU and memory as torch_neuronx.profiling samples them (counter
    events of category ``neuron_host``), or None without any."""
    cpu, process, used, rss = [], [], [], []
    for e in trace.get("traceEvents", ()):
        if e.get("ph") != "C" or e.get("cat") != "neuron_host":
            continue
        args = e.get("args") or {}
        if e.get("name") == "host CPU utilisation (%)" and "all" in args:
            cpu.append(float(args["all"]))
        elif e.get("name") == "process CPU (%)" and "process" in args:
            process.append(float(args["process"]))
        elif e.get("name") == "host memory (bytes)":
            used.append(int(args.get("used", 0)))
            rss.append(int(args.get("process RSS", 0)))
    if not cpu and not used:
        return None
    out = {"cpu": None, "memory": None}
    if cpu:
        out["cpu"] = {"samples": len(cpu), "mean_pct": sum(cpu) / len(cpu), "max_pct": max(cpu),
                      "process_mean_pct": sum(process) / len(process) if process else None}
    if used:
        out["memory"] = {"samples": len(used), "peak_used": max(used), "peak_process_rss": max(rss)}
    return out


# -- recommendations ------------------------------------------------------------------

def recommend(summary: dict) -> list:
    """Findings ranked by the share of the resource at stake: of all device time for
    time findings (busy + idle, every core), of reserved memory for the allocator."""
    recs = []
    device_time = summary["window_us"] * len(summary["cores"])
    idle = summary["idle_us"]
    if summary["has_device_rows"] and device_time > 0:
        for site in summary["sync_sites"]:
            if site["idle_us"] <= 0:
                continue
            where = f" called from `{site['frame_label']}`" if site["frame_label"] else ""
            recs.append({
                "kind": "sync", "score": site["idle_us"] / device_time,
                "title": f"{_pct(site['share_of_idle'])} of device idle time is spent in `{site['label']}`{where}",
                "evidence": [f"{site['calls']} call(s) of {site['op']}, {_fmt_us(site['idle_us'])} of device idle "
                             f"time while the host waited (of {_fmt_us(idle)} idle in all)",
                             "the queue drains during each wait, and the device idles until the host queues new work"],
                "advice": "Read values back less often: keep running results on the device and read them every "
                          "N steps, or replace data-dependent Python branches with tensor operations.",
            })
        hb = summary["idle"]["host_bound"]
        if hb > 0:
            ops = ", ".join(f"{n} ({_fmt_us(us)})" for n, us in summary["host_bound_ops"][:3])
            recs.append({
                "kind": "host_bound", "score": hb / device_time,
                "title": f"{_pct(_share(hb, idle))} of device idle time is host-bound: "
                         "the device waited while the host was still issuing operators",
                "evidence": [f"{_fmt_us(hb)} of device idle time inside host operators"]
                            + ([f"operators the host was running: {ops}"] if ops else []),
                "advice": "Issue fewer, larger operations: torch.compile(model, backend=\"neuron\"), larger batches, "
                          "foreach/fused optimizers.",
            })
        eq = summary["idle"]["empty_queue"]
        if eq > 0:
            frames = ", ".join(f"{n} ({_fmt_us(us)})" for n, us in summary["empty_queue_frames"][:3])
            recs.append({
                "kind": "empty_queue", "score": eq / device_time,
                "title": f"{_pct(_share(eq, idle))} of device idle time has an empty queue: "
                         "the host was outside any operator",
                "evidence": [f"{_fmt_us(eq)} of device idle time with no operator running on the host"]
                            + ([f"where the program was: {frames}"] if frames else []),
                "advice": "Overlap the Python work between steps with device work: load data in DataLoader "
                          "workers with pin_memory, copy with non_blocking=True, queue the next step before logging.",
            })
        qd = summary["idle"]["queued"]
        if qd > 0:
            recs.append({
                "kind": "queued", "score": qd / device_time,
                "title": f"{_pct(_share(qd, idle))} of device idle time had tasks queued but not started",
                "evidence": [f"{_fmt_us(qd)} between a task's enqueue and its start while its core was idle"],
                "advice": "Tasks waiting on other streams (events, record_stream) or on a busy executor: check the "
                          "streams' dependencies in the timeline.",
            })
        copy = summary["kinds"].get("copy", {})
        if copy.get("us", 0) > 0:
            recs.append({
                "kind": "copies", "score": copy["us"] / device_time,
                "title": f"Copies take {_pct(copy['share'])} of device task time",
                "evidence": [f"{copy['tasks']} copy task(s), {_fmt_us(copy['us'])}"],
                "advice": "Keep data on the device between steps; pinned host memory and non_blocking=True copies "
                          "let copies overlap compute.",
            })
    for mem in summary["memory"]:
        if mem["device_type"] == 0 or mem["peak_reserved"] <= 0:
            continue
        frag = mem["fragmentation"]
        recs.append({
            "kind": "fragmentation", "score": frag,
            "title": f"{_pct(frag)} of {mem['label']}'s peak reserved memory was never in use at once",
            "evidence": [f"peak reserved {_fmt_bytes(mem['peak_reserved'])}, peak allocated "
                         f"{_fmt_bytes(mem['peak_allocated'])}"],
            "advice": "Cached blocks of sizes no later request fits: torch.neuron.empty_cache() between phases, "
                      "or allocate buffers of fixed sizes once.",
        })
    if not summary["has_device_rows"]:
        recs.append({
            "kind": "no_device_rows", "score": 0.0,
            "title": "The trace has no device activity",
            "evidence": [f"{summary['host_ops']} host ranges, no device task rows"],
            "advice": "Profile with activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1] to see "
                      "device time; this report shows the host side only.",
        })
    recs = [r for r in recs if r["score"] >= RECOMMENDATION_MIN_SHARE or r["kind"] == "no_device_rows"]
    recs.sort(key=lambda r: -r["score"])
    for rank, r in enumerate(recs, 1):
        r["rank"] = rank
    return recs
