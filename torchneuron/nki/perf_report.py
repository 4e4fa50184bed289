"""The performance model's report of one launch (latency, MFU, MBU, the engines' use, the
instruction timeline) and the files it is written to: Trace Event JSON, summaries, the
explorer's ``neuronNkiKernels`` layout in a profiler trace."""
from __future__ import annotations

import json

import numpy as np

from .perf_costs import ENGINES


class Report:
    """The modelled execution of one kernel launch on one NeuronCore."""

    def __init__(self, machine, latency_ns, busy, counts, flops, ideal_ns, hbm_bytes, events, kernel_name=""):
        self.machine = machine
        self.kernel_name = kernel_name
        self.latency_ns = latency_ns
        self.flops = flops
        self.hbm_bytes = hbm_bytes
        self.instructions = sum(counts.values())
        self.engines = {e: {"busy_ns": busy[e], "busy": (busy[e] / latency_ns if latency_ns else 0.0),
                            "instructions": counts[e]} for e in ENGINES}
        self.mfu = ideal_ns / latency_ns if latency_ns else 0.0
        self.mbu = (hbm_bytes / machine.dma_bytes_per_ns) / latency_ns if latency_ns else 0.0
        self._events = events
        self.occupancy = [(0.0, 0, 0)]
        self.kernel_file = None

    @property
    def latency_us(self):
        return self.latency_ns / 1e3

    @property
    def bottleneck(self):
        return max(ENGINES, key=lambda e: self.engines[e]["busy_ns"])

    def timeline(self):
        """The instructions on their engines: a list of dicts with ``engine``, ``start`` and ``end``
        (ns from the kernel's start), ``name``, ``source`` (file:line), and ``ready`` (when a
        consumer may start), ``instance`` (SPMD program id), ``function``, ``step``."""
        return [dict(e) for e in self._events]

    def summary(self) -> str:
        lines = [f"modelled on {self.machine.device} ({self.machine.name}): {self.latency_us:.2f} us, "
                 f"MFU {100 * self.mfu:.1f}%, MBU {100 * self.mbu:.1f}%, {self.instructions} instructions"]
        for e in ENGINES:
            s = self.engines[e]
            if s["instructions"]:
                lines.append(f"  {e:<7} {100 * s['busy']:5.1f}% busy, {s['instructions']} instructions")
        return "\n".join(lines)

    def nki_trace(self, source=None):
        """This kernel in the explorer's ``neuronNkiKernels`` layout (docs/explorer.md): instructions per
        engine with their kernel lines, SBUF/PSUM occupancy over time, the capacities, and ``source``
        (by default the text of the kernel's file, whose line numbers the instructions name)."""
        names = {"tensor": "Tensor", "vector": "Vector", "scalar": "Scalar", "gpsimd": "GpSimd", "dma": "DMA"}
        if source is None:
            source = self.source_text()
        return {
            "kernel": self.kernel_name, "source": source,
            "instructions": [{"engine": names[e["engine"]], "name": e["name"], "start_ns": e["start"],
                              "end_ns": e["end"], "line": e["source"]} for e in self._events],
            "occupancy": [{"t_ns": t, "sbuf_bytes": sb, "psum_bytes": ps} for t, sb, ps in self.occupancy],
            "sbuf_capacity": self.machine.sbuf_bytes,
            "psum_capacity": self.machine.psum_bytes_per_partition * self.machine.partitions,
            "machine": self.machine.key, "latency_ns": self.latency_ns, "mfu": self.mfu, "mbu": self.mbu,
        }

    def source_text(self):
        files = [e["source"].rsplit(":", 1)[0] for e in self._events]
        if self.kernel_file:
            files.insert(0, self.kernel_file)
        for f in files:
            try:
                with open(f) as fh:
                    return fh.read()
            except OSError:
                continue
        return ""

    def to_dict(self):
        return {"kernel": self.kernel_name, "machine": self.machine.key, "device": self.machine.device,
                "neuron_core": self.machine.name, "latency_ns": self.latency_ns, "mfu": self.mfu,
                "mbu": self.mbu, "flops": self.flops, "hbm_bytes": self.hbm_bytes,
                "instructions": self.instructions, "engines": self.engines}

    def __repr__(self):
        return f"<nki performance model: {self.summary()}>"


def chrome_trace(report: Report) -> dict:
    """The timeline in the Trace Event format (chrome://tracing, Perfetto): one row per engine."""
    tids = {e: i for i, e in enumerate(ENGINES)}
    events = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tids[e], "args": {"name": e}} for e in ENGINES]
    for ev in report.timeline():
        events.append({"name": ev["name"], "cat": ev["engine"], "ph": "X", "pid": 0, "tid": tids[ev["engine"]],
                       "ts": ev["start"] / 1e3, "dur": max(ev["end"] - ev["start"], 0.0) / 1e3,
                       "args": {"source": ev["source"], "instance": list(ev["instance"]), "step": ev["step"]}})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"format": "torchneuron-nki-trace", **report.to_dict()}}


def write_trace(report: Report, path: str):
    """Write the kernel's modelled instruction trace (JSON, Trace Event format plus the report)."""
    data = chrome_trace(report)
    data["instructions"] = report.timeline()
    data["neuronNkiKernels"] = [report.nki_trace()]
    with open(path, "w") as f:
        json.dump(data, f, default=_json_default)


def add_to_profiler(prof, *reports):
    """Put the reports' instruction traces into a ``torch.profiler.profile`` trace (its
    ``neuronNkiKernels`` metadata, which the explorer's NKI view draws)."""
    prof.add_metadata_json("neuronNkiKernels", json.dumps([r.nki_trace() for r in reports], default=_json_default))


def write_summary(report: Report, path: str, **extra):
    with open(path, "w") as f:
        json.dump({**report.to_dict(), **extra}, f, indent=1, default=_json_default)


def _json_default(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, tuple):
        return list(v)
    return str(v)
