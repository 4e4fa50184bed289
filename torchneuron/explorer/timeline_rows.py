"""The report's tables: the operators table (one row per operator name) and the
timeline's rows (host threads with their operator lanes, device streams with
their tasks), written compactly with every string stored once."""
from __future__ import annotations

from collections import defaultdict

from .trace_events import Trace, op_ancestors


class StringTable:
    """The report's strings, each stored once: ``id(s)`` is its index in ``strings``,
    given in order of first use."""

    def __init__(self):
        self.strings, self._ids = [], {}

    def id(self, s) -> int:
        if s not in self._ids:
            self._ids[s] = len(self.strings)
            self.strings.append(s)
        return self._ids[s]


def operator_rows(tr: Trace) -> list:
    """One row per operator name: calls, host and device time (self and total, a
    recursive call counted once), tasks, events (host event indices) and the five
    commonest stacks; most device time first."""
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
        if not any(p.name == ev.name for p in op_ancestors(ev)):
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
    return operators


def timeline(tr: Trace, t0, main_key, strings: StringTable) -> dict:
    """The timeline's rows and events, times from t0: host rows (the main thread first)
    and their operators, stream rows and their tasks, the fused groups' member lists;
    ``op_index`` maps a host event's index to its row in ``ops``."""
    host_rows, row_of_thread = _host_rows(tr, main_key)
    op_index = {}
    op_events = []
    for ev in tr.host:
        if ev.is_frame or (ev.pid, ev.tid) not in row_of_thread:
            continue
        op_index[ev.index] = len(op_events)
        op_events.append(ev)
    sid = strings.id
    ops_table = [[row_of_thread[(ev.pid, ev.tid)], round(ev.ts - t0, 3), round(ev.dur, 3), sid(ev.name),
                  ev.lane, sid(ev.cat), ev.stack, ev.ext_id if isinstance(ev.ext_id, int) else -1]
                 for ev in op_events]
    stream_rows, row_of_stream = _stream_rows(tr)
    tasks_table, fused_lists = _tasks_table(tr, t0, row_of_stream, op_index, strings)
    return {"host_rows": host_rows, "ops": ops_table, "stream_rows": stream_rows, "tasks": tasks_table,
            "fused_lists": fused_lists, "op_index": op_index}


def _host_rows(tr: Trace, main_key):
    """(a row per thread with operators, {thread: its row})."""
    host_rows, row_of_thread = [], {}
    for key in sorted(tr.threads, key=lambda k: (k != main_key, str(k))):
        evs = tr.ops_by_thread.get(key)
        if not evs:
            continue
        row_of_thread[key] = len(host_rows)
        host_rows.append({"pid": key[0], "tid": key[1],
                          "label": tr.thread_names.get(key) or f"thread {key[1]}",
                          "lanes": max(ev.lane for ev in evs) + 1})
    return host_rows, row_of_thread


def _stream_rows(tr: Trace):
    """(a row per (device, stream) with tasks, in order, {(device, stream): its row})."""
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
    return stream_rows, row_of_stream


def _tasks_table(tr: Trace, t0, row_of_stream, op_index, strings: StringTable):
    """(a row per task, the fused groups' member lists the rows point into)."""
    sid = strings.id
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
    return tasks_table, fused_lists
