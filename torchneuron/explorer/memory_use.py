"""Device memory over time, from the allocator's ``[memory]`` events: counters,
peaks, fragmentation, and each allocation with the operator and task that
made it."""
from __future__ import annotations

from collections import defaultdict

from .intervals import share
from .trace_events import RUNTIME_CATS, Trace, as_int

# c10::DeviceType values that can appear in "[memory]" events.
DEVICE_TYPE_NAMES = {0: "cpu", 1: "cuda", 20: "neuron"}


def memory_figures(tr: Trace, t0):
    """Per device (c10 device type, index): the allocator's counters over time, its
    peaks, its fragmentation (the share of peak reserved memory beyond the peak
    allocated) and each allocation with the operator and task that made it."""
    per_device = defaultdict(list)
    for e in tr.memory:
        args = e.get("args") or {}
        key = (as_int(args.get("Device Type"), 0), as_int(args.get("Device Id"), -1))
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
            allocated = as_int(args.get("Total Allocated"), 0)
            reserved = as_int(args.get("Total Reserved"), 0)
            nbytes = as_int(args.get("Bytes"), 0)
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
            "fragmentation": share(peak_reserved - peak_alloc, peak_reserved) if peak_reserved > peak_alloc else 0.0,
            "peak_allocated_t": round(peak_t - t0, 3) if peak_t is not None else None,
            "series": series, "allocations": allocations,
        })
    return devices
