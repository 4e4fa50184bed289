"""The report's recommendations: findings ranked by the share of the resource
at stake, each with its evidence and advice."""
from __future__ import annotations

from .intervals import share

# A recommendation is made when its share of the resource at stake reaches this.
RECOMMENDATION_MIN_SHARE = 0.05


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


def recommend(summary: dict) -> list:
    """Findings ranked by the share of the resource at stake: of all device time for
    time findings (busy + idle, every core), of reserved memory for the allocator."""
    recs = []
    device_time = summary["window_us"] * len(summary["cores"])
    if summary["has_device_rows"] and device_time > 0:
        recs += _wait_findings(summary, device_time) + _idle_findings(summary, device_time)
        recs += _copy_findings(summary, device_time)
    recs += _memory_findings(summary)
    recs += _no_device_rows_findings(summary)
    recs = [r for r in recs if r["score"] >= RECOMMENDATION_MIN_SHARE or r["kind"] == "no_device_rows"]
    recs.sort(key=lambda r: -r["score"])
    for rank, r in enumerate(recs, 1):
        r["rank"] = rank
    return recs


def _wait_findings(summary: dict, device_time) -> list:
    """Device idle time spent in each synchronising call site."""
    recs = []
    idle = summary["idle_us"]
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
    return recs


def _idle_findings(summary: dict, device_time) -> list:
    """Device idle time by its other causes: host-bound issue, an empty queue, queued work."""
    recs = []
    idle = summary["idle_us"]
    hb = summary["idle"]["host_bound"]
    if hb > 0:
        ops = ", ".join(f"{n} ({_fmt_us(us)})" for n, us in summary["host_bound_ops"][:3])
        recs.append({
            "kind": "host_bound", "score": hb / device_time,
            "title": f"{_pct(share(hb, idle))} of device idle time is host-bound: "
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
            "title": f"{_pct(share(eq, idle))} of device idle time has an empty queue: "
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
            "title": f"{_pct(share(qd, idle))} of device idle time had tasks queued but not started",
            "evidence": [f"{_fmt_us(qd)} between a task's enqueue and its start while its core was idle"],
            "advice": "Tasks waiting on other streams (events, record_stream) or on a busy executor: check the "
                      "streams' dependencies in the timeline.",
        })
    return recs


def _copy_findings(summary: dict, device_time) -> list:
    recs = []
    copy = summary["kinds"].get("copy", {})
    if copy.get("us", 0) > 0:
        recs.append({
            "kind": "copies", "score": copy["us"] / device_time,
            "title": f"Copies take {_pct(copy['share'])} of device task time",
            "evidence": [f"{copy['tasks']} copy task(s), {_fmt_us(copy['us'])}"],
            "advice": "Keep data on the device between steps; pinned host memory and non_blocking=True copies "
                      "let copies overlap compute.",
        })
    return recs


def _memory_findings(summary: dict) -> list:
    """The allocator's fragmentation on each device."""
    recs = []
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
    return recs


def _no_device_rows_findings(summary: dict) -> list:
    recs = []
    if not summary["has_device_rows"]:
        recs.append({
            "kind": "no_device_rows", "score": 0.0,
            "title": "The trace has no device activity",
            "evidence": [f"{summary['host_ops']} host ranges, no device task rows"],
            "advice": "Profile with activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1] to see "
                      "device time; this report shows the host side only.",
        })
    return recs
