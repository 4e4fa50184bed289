"""Device idle time by cause, and where the host was meanwhile: each core's busy
and idle time, the idle split into queued work not started, waits in
synchronising calls, host-bound issue and an empty queue, and the call sites,
operators and Python frames each cause points at."""
from __future__ import annotations

import bisect
import re
from collections import defaultdict

from .intervals import intersect_intervals, merge_intervals, share, subtract_intervals, total_length
from .python_frames import frame_label, is_user_frame
from .trace_events import RUNTIME_CATS, TIME_EPS, Trace, op_ancestors

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


def _launch_time(t):
    """When a task entered its queue: its own record, else its operator's start."""
    if t.queued is not None:
        return t.queued
    return t.op.ts if t.op is not None else t.ts


def sync_calls(tr: Trace):
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


def main_thread(tr: Trace):
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


def idle_figures(tr: Trace, window, calls, sync_iv, host_op_iv, main_key) -> dict:
    """The summary's idle figures over ``window`` (t0, t1): per core, per cause, and the
    ten call sites, host operators and Python frames with the most idle time."""
    cores, idle_parts, total_idle = _cores(tr, window, sync_iv, host_op_iv)
    idle_totals = {c: sum(total_length(iv) for iv in idle_parts[c]) for c in IDLE_CAUSES}
    return {
        "cores": cores, "idle_us": total_idle, "idle": idle_totals,
        "idle_share": {c: share(idle_totals[c], total_idle) for c in IDLE_CAUSES},
        "sync_sites": _sync_sites(tr, calls, idle_parts["sync"], total_idle)[:10],
        "host_bound_ops": _host_bound_ops(tr, idle_parts["host_bound"])[:10],
        "empty_queue_frames": _empty_queue_frames(tr, main_key, idle_parts["empty_queue"])[:10],
    }


def _cores(tr: Trace, window, sync_iv, host_op_iv):
    """(a row per core, {cause: [each core's idle intervals]}, the idle time of all cores)."""
    t0, t1 = window
    window_us = t1 - t0
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
            "utilization": share(total_length(busy), window_us), "tasks": len(tasks),
            "streams": streams,
            "idle": {c: total_length(causes[c]) for c in IDLE_CAUSES},
        })
    return cores, idle_parts, total_idle


def _sync_sites(tr: Trace, calls, sync_idle, total_idle) -> list:
    """Waiting idle per call site: the synchronising call and the user's frame around it,
    most idle first."""
    sites = {}
    for ev, label, waited in calls:
        frame = tr.user_frame(ev)
        key = (label, ev.name, frame)
        site = sites.setdefault(key, {"label": label, "op": ev.name, "frame": frame,
                                      "frame_label": frame_label(frame) if frame else None,
                                      "calls": 0, "waited_calls": 0, "idle_us": 0.0, "host_us": 0.0})
        site["calls"] += 1
        site["host_us"] += ev.dur
        if waited:
            site["waited_calls"] += 1
            site["idle_us"] += sum(total_length(intersect_intervals(iv, [[ev.ts, ev.end]])) for iv in sync_idle)
    sync_sites = sorted(sites.values(), key=lambda s: (-s["idle_us"], -s["host_us"]))
    for s in sync_sites:
        s["share_of_idle"] = share(s["idle_us"], total_idle)
    return sync_sites


def _host_bound_ops(tr: Trace, host_bound_idle) -> list:
    """Host-bound idle by the outermost operator the host was running (annotations aside),
    as [name, us], most first."""
    host_bound_ops = defaultdict(float)
    hb = [iv for parts in host_bound_idle for iv in parts]
    top_ops = sorted((ev for ev in tr.host if ev.cat in ("cpu_op",) + RUNTIME_CATS
                      and not any(p.cat != "user_annotation" for p in op_ancestors(ev))), key=lambda ev: ev.ts)
    hb_merged = sorted(hb)
    hb_ends = [e for _, e in hb_merged]
    for ev in top_ops:
        lo = bisect.bisect_left(hb_ends, ev.ts)
        for s, e in hb_merged[lo:]:
            if s >= ev.end:
                break
            host_bound_ops[ev.name] += max(0.0, min(e, ev.end) - max(s, ev.ts))
    return sorted(([n, us] for n, us in host_bound_ops.items() if us > 0), key=lambda x: -x[1])


def _empty_queue_frames(tr: Trace, main_key, empty_queue_idle) -> list:
    """Empty-queue idle by the Python frame the main thread was in (at each gap's middle),
    as [frame, us], most first."""
    empty_frames = defaultdict(float)
    for parts in empty_queue_idle:
        for s, e in parts:
            frame = _python_at(tr, main_key, (s + e) / 2)
            empty_frames[frame_label(frame) if frame else "(outside Python frames)"] += e - s
    return sorted(([n, us] for n, us in empty_frames.items()), key=lambda x: -x[1])
