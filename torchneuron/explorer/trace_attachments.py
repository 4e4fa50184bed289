"""What other tools add to a trace, read tolerantly: the Trainium twin's account
of the profiled work (torchneuron.target) and the host's CPU and memory as
torch_neuronx.profiling samples them."""
from __future__ import annotations

from .trace_events import as_int


def target_model(trace: dict):
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
            "bound": str(o.get("bound", "")), "count": as_int(o.get("count"), 0)}
           for o in m.get("top_ops") or [] if isinstance(o, dict)]
    return {
        "target": str(m.get("target", "?")), "device": str(m.get("device", "")), "lnc": as_int(m.get("lnc"), 0),
        "device_us": number(m, "device_s") * 1e6, "launches": as_int(m.get("launches"), 0),
        "steps": as_int(m.get("steps"), 0),
        "bound_us": {k: v * 1e6 for k, v in seconds_by("bound_s").items()},
        "engine_us": {k: v * 1e6 for k, v in seconds_by("engine_s").items()},
        "eager_compiles": as_int(m.get("eager_compiles"), 0), "graph_compiles": as_int(m.get("graph_compiles"), 0),
        "compile_s": number(m, "compile_s"), "top_ops": ops,
        "churn": [c for c in m.get("churn") or [] if isinstance(c, dict)],
        "wide_findings": as_int(m.get("wide_findings"), 0),
        "assumptions": [str(v) for v in (m.get("assumptions") or {}).values()]
                       if isinstance(m.get("assumptions"), dict) else [],
    }


def host_samples(trace: dict):
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
