"""Shared helpers: devices, synchronisation, timing, the machine description."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torchneuron

# The demo model (examples/gpt_model.py) is shared with the end-to-end benchmarks.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from gpt_model import fmt_bytes  # noqa: E402,F401  (re-exported for report.py)

NEURON = torch.device("neuron")
CPU = torch.device("cpu")
DEVICES = (NEURON, CPU)


@dataclass
class Config:
    """Sizes and repeat counts; `smoke` shrinks everything to seconds."""
    smoke: bool = False

    def pick(self, full, smoke):
        return smoke if self.smoke else full

    @property
    def repeats(self) -> int:
        return self.pick(7, 2)


def sync(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, *, wait: bool = True) -> float:
    """Seconds for one call of `fn`, starting from an idle device; with
    `wait` the clock stops after the device finished the work, else as soon
    as the host returns (the enqueue time)."""
    sync(device)
    t0 = time.perf_counter()
    result = fn()  # held until the clock stops: a result freed early is never written (adaptive eager)
    if wait:
        sync(device)
    elapsed = time.perf_counter() - t0
    del result
    return elapsed


def fused_in_one_step(step) -> dict:
    """What adaptive eager did in one call of `step` on neuron, after a first
    one (the first call of each signature runs on its own, synchronously): the
    fuser's own counters."""
    step()
    torch.neuron.synchronize()
    torchneuron.clear_op_tracking()
    step()
    torch.neuron.synchronize()
    return {"fused_tasks_per_step": torchneuron._C._fused_groups(),
            "fused_ops_per_step": sum(torchneuron.get_fused_ops().values()),
            "elided_intermediates_per_step": torchneuron._C._elided_intermediates()}


def median(xs) -> float:
    return float(statistics.median(xs))


def compare(make: Callable[[torch.device], Callable[[], object]], cfg: Config, *,
            warmup: int = 1, per: int = 1, repeats: int | None = None) -> dict:
    """Runs the callable built by `make(device)` on neuron and on the CPU,
    alternating devices repeat by repeat (so drift on a shared machine hits
    both), and returns the medians per unit of work (`per` units per call)."""
    repeats = repeats or cfg.repeats
    fns = {d.type: make(d) for d in DEVICES}
    for d in DEVICES:
        for _ in range(warmup):
            timed(fns[d.type], d)
    samples = {d.type: [] for d in DEVICES}
    for _ in range(repeats):
        for d in DEVICES:
            samples[d.type].append(timed(fns[d.type], d) / per)
    out = {"neuron_s": median(samples["neuron"]), "cpu_s": median(samples["cpu"]),
           "neuron_samples_s": samples["neuron"], "cpu_samples_s": samples["cpu"]}
    out["ratio_time"] = out["neuron_s"] / out["cpu_s"]     # < 1: neuron faster
    out["speed_vs_cpu"] = out["cpu_s"] / out["neuron_s"]   # > 1: neuron faster
    return out


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict:
    return {
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "torch_version": torch.__version__,
        "torch_num_threads": torch.get_num_threads(),
        "neuron_devices": torch.neuron.device_count(),
        "isa": torchneuron._C._isa(),  # the device's own loops: the level they run at and the host's highest
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_start": list(os.getloadavg()),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def fmt_time(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def run_alone(group: str, run: Callable, targets: Callable, value_format: str = ".2f") -> None:
    """`python -m benchmarks.<group> [--smoke]`: one group's run, printed with its targets."""
    import argparse
    import json

    p = argparse.ArgumentParser(description=f"the {group} benchmarks alone")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--json", metavar="FILE", help="also write the group's results to FILE")
    args = p.parse_args()

    class _NoProgress:
        def update(self, n):
            pass

    result = {group: run(Config(smoke=args.smoke), _NoProgress())}
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result[group], f, indent=1)
    for t in targets(result):
        print(f"{t['name']}: {t['value']:{value_format}} {t['figure']} (target {t['threshold']}): "
              f"{'met' if t['met'] else 'NOT met'}")
