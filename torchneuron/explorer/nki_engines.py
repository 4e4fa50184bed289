"""NKI kernels' instruction traces (the trace's top-level ``neuronNkiKernels``):
each engine's busy time and the on-chip memory occupancy."""
from __future__ import annotations

from .intervals import merge_intervals, total_length
from .trace_events import as_int

NKI_ENGINES = ("Tensor", "Vector", "Scalar", "GpSimd", "DMA")


def nki_kernels(trace: dict):
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
                occupancy.append([float(o.get("t_ns", 0)), as_int(o.get("sbuf_bytes"), 0),
                                  as_int(o.get("psum_bytes"), 0)])
        occupancy.sort()
        span = max((i["end_ns"] for i in instructions), default=0.0) - min(
            (i["start_ns"] for i in instructions), default=0.0)
        kernels.append({
            "kernel": str(k.get("kernel", "kernel")), "source": k.get("source") if isinstance(k.get("source"), str) else "",
            "instructions": instructions, "engines": engines, "engine_busy_ns": busy, "span_ns": span,
            "occupancy": occupancy,
            "sbuf_capacity": as_int(k.get("sbuf_capacity"), 0), "psum_capacity": as_int(k.get("psum_capacity"), 0),
            "peak_sbuf": max((o[1] for o in occupancy), default=0),
            "peak_psum": max((o[2] for o in occupancy), default=0),
        })
    return kernels
