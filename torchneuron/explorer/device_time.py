"""Device time: how much of it the host overlapped, and what it went to, by
launching operator, by task kind and by fused group."""
from __future__ import annotations

from collections import defaultdict

from .intervals import intersect_intervals, merge_intervals, share, subtract_intervals, total_length
from .trace_events import Trace

TASK_KINDS = ("op", "fused", "compiled", "nki", "copy")


def overlap(tr: Trace, host_op_iv, sync_iv) -> dict:
    """Host time spent issuing work (not waiting in synchronising calls) against device
    busy time, and their overlap."""
    device_busy = merge_intervals([[t.ts, t.end] for t in tr.tasks])
    host_active = subtract_intervals(host_op_iv, sync_iv)
    overlap_us = total_length(intersect_intervals(host_active, device_busy))
    return {"host_active_us": total_length(host_active), "device_busy_us": total_length(device_busy),
            "overlap_us": overlap_us,
            "share_of_device_busy": share(overlap_us, total_length(device_busy)),
            "share_of_host_active": share(overlap_us, total_length(host_active))}


def device_time_figures(tr: Trace) -> dict:
    """The summary's device time: in all, by launching operator (top 15), by task kind
    and by fused group (top 15)."""
    device_time_total = sum(t.dur for t in tr.tasks)
    return {"device_time_us": device_time_total, "top_device_ops": _by_launcher(tr, device_time_total),
            "kinds": _by_kind(tr, device_time_total), "fused_groups": _fused_groups(tr)}


def _by_launcher(tr: Trace, device_time_total) -> list:
    by_launcher = {}
    for t in tr.tasks:
        name = t.op.name if t.op is not None else (str(t.operator) if t.operator else t.name)
        row = by_launcher.setdefault(name, {"name": name, "device_us": 0.0, "tasks": 0, "kinds": defaultdict(float)})
        row["device_us"] += t.dur
        row["tasks"] += 1
        row["kinds"][t.kind] += t.dur
    top_device_ops = sorted(by_launcher.values(), key=lambda r: -r["device_us"])[:15]
    for r in top_device_ops:
        r["share"] = share(r["device_us"], device_time_total)
        r["kinds"] = dict(r["kinds"])
    return top_device_ops


def _by_kind(tr: Trace, device_time_total) -> dict:
    kinds = {}
    for k in list(TASK_KINDS) + sorted({t.kind for t in tr.tasks} - set(TASK_KINDS)):
        us = sum(t.dur for t in tr.tasks if t.kind == k)
        n = sum(1 for t in tr.tasks if t.kind == k)
        kinds[k] = {"us": us, "tasks": n, "share": share(us, device_time_total)}
    return kinds


def _fused_groups(tr: Trace) -> list:
    groups = {}
    for t in tr.tasks:
        if t.fused_members:
            key = tuple(t.fused_members)
            g = groups.setdefault(key, {"members": list(key), "us": 0.0, "tasks": 0})
            g["us"] += t.dur
            g["tasks"] += 1
    return sorted(groups.values(), key=lambda g: -g["us"])[:15]
