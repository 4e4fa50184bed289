"""Where the time went, from a PyTorch profiler trace: the explorer's analysis.

``analyze(trace)`` returns one JSON-serialisable dict; the renderer embeds it
in the report as is, and the tests check its figures. Times are microseconds
on the trace's clock, except in the NKI part (nanoseconds, as given).
docs/explorer.md defines each figure; the trace format read is trace_events.py's.
"""
from __future__ import annotations

from .device_time import device_time_figures, overlap
from .idle_time import IDLE_CAUSE_LABELS, idle_figures, main_thread, sync_calls
from .intervals import merge_intervals, total_length  # noqa: F401  (total_length: a name the tests use here)
from .memory_use import memory_figures
from .nki_engines import nki_kernels
from .python_frames import frame_label, is_user_frame
from .recommendations import recommend
from .timeline_rows import StringTable, operator_rows, timeline
from .trace_attachments import host_samples, target_model
from .trace_events import HOST_OP_CATS, RUNTIME_CATS, Trace
from .trace_files import load_trace


def analyze(source) -> dict:
    """The report's data: summary figures, recommendations, timeline rows, operators,
    memory and NKI kernels, from a trace dict or path."""
    tr = Trace(load_trace(source))
    t0, t1 = _window(tr)
    strings = StringTable()
    # Host state over time, shared by every core's idle classification.
    host_op_iv = merge_intervals([[ev.ts, ev.end] for ev in tr.host if ev.cat in ("cpu_op",) + RUNTIME_CATS])
    calls = sync_calls(tr)
    sync_iv = merge_intervals([[ev.ts, ev.end] for ev, _, waited in calls if waited])
    main_key = main_thread(tr)

    idle = idle_figures(tr, (t0, t1), calls, sync_iv, host_op_iv, main_key)
    device_time = device_time_figures(tr)
    operators = operator_rows(tr)
    rows = timeline(tr, t0, main_key, strings)
    op_index = rows.pop("op_index")
    for row in operators:
        row["events"] = [op_index[i] for i in row["events"] if i in op_index]
    memory = memory_figures(tr, t0)
    for dev in memory:
        for a in dev["allocations"]:
            a["op"] = op_index.get(a["op"], -1)

    summary = {
        "window_us": t1 - t0, "t0": t0, "host_threads": len(rows["host_rows"]), "host_ops": len(rows["ops"]),
        "device_tasks": len(tr.tasks), "has_device_rows": bool(tr.tasks), "synthetic_device_rows": tr.synthetic,
        **idle,
        "overlap": overlap(tr, host_op_iv, sync_iv), "device_time_us": device_time["device_time_us"],
        "top_device_ops": device_time["top_device_ops"], "kinds": device_time["kinds"],
        "fused_groups": device_time["fused_groups"],
        "memory": [{k: v for k, v in d.items() if k not in ("series", "allocations")} for d in memory],
        "host_samples": host_samples(tr.raw),
        # torch_neuronx.profiling's account of the capture: rank, modes, what was and was not produced.
        "neuron_profile": tr.raw.get("neuronProfile") if isinstance(tr.raw.get("neuronProfile"), dict) else None,
        "target": target_model(tr.raw),
    }
    summary["recommendations"] = recommend(summary)
    return {
        "version": 1,
        "summary": summary,
        "strings": strings.strings,
        "stacks": [[strings.id(frame_label(f)) for f in s] for s in tr.stacks],
        "stack_user": [[is_user_frame(f) for f in s] for s in tr.stacks],
        "host_rows": rows["host_rows"], "ops": rows["ops"],
        "stream_rows": rows["stream_rows"], "tasks": rows["tasks"], "fused_lists": rows["fused_lists"],
        "operators": operators, "memory": memory, "nki": nki_kernels(tr.raw),
        "idle_labels": IDLE_CAUSE_LABELS,
    }


def _window(tr: Trace):
    """(first start, last end) of the host operators and device tasks (else of any host range)."""
    spans = [(ev.ts, ev.end) for ev in tr.host if ev.cat in HOST_OP_CATS]
    spans += [(t.ts, t.end) for t in tr.tasks]
    if not spans:
        spans = [(ev.ts, ev.end) for ev in tr.host]
    if not spans:
        return 0.0, 0.0
    return min(s for s, _ in spans), max(e for _, e in spans)
