"""What torch.profiler costs on `neuron`, per device task.

A loop of tiny operators (the tiny_ops group's `add` of 8 elements) issued N
times and synchronised: with no profiler, under a CPU-only profiler session
(PyTorch's own per-operator recording) and under a session with
ProfilerActivity.NEURON (that plus the device's launcher records and task
activities). The device's own cost is the difference between the last two;
the CPU backend under a CPU-only session is timed beside them. Medians over
repeats, per operator call; the session's start and end (trace processing)
are outside the timing.
"""

from __future__ import annotations

import time

import torch
from torch.profiler import ProfilerActivity, profile

from .common import CPU, NEURON, Config, median, sync

STEPS = 1
DEVICE_COST_MAX_US = 2.0


def _per_call(x, n, activities):
    def loop():
        for _ in range(n):
            x + x
        sync(x.device)

    loop()  # warm-up: meta cache, allocator, first-call checks
    if activities is None:
        t0 = time.perf_counter()
        loop()
        return (time.perf_counter() - t0) / n
    with profile(activities=activities):
        t0 = time.perf_counter()
        loop()
        elapsed = time.perf_counter() - t0
    return elapsed / n


def run(cfg: Config, bar) -> dict:
    n = cfg.pick(2000, 50)
    x, c = torch.randn(8, device=NEURON), torch.randn(8, device=CPU)
    cases = {"neuron_off_s": (x, None), "neuron_cpu_session_s": (x, [ProfilerActivity.CPU]),
             "neuron_device_session_s": (x, [ProfilerActivity.CPU, ProfilerActivity.NEURON]),
             "cpu_cpu_session_s": (c, [ProfilerActivity.CPU])}
    samples = {k: [] for k in cases}
    for _ in range(cfg.repeats):
        for k, (t, acts) in cases.items():
            samples[k].append(_per_call(t, n, acts))
    out = {"calls_per_sample": n, **{k: median(v) for k, v in samples.items()},
           **{k.replace("_s", "_samples_s"): v for k, v in samples.items()}}
    out["device_activity_cost_us"] = (out["neuron_device_session_s"] - out["neuron_cpu_session_s"]) * 1e6
    out["cpu_session_cost_us"] = (out["neuron_cpu_session_s"] - out["neuron_off_s"]) * 1e6
    bar.update(1)
    return out


def targets(res: dict) -> list[dict]:
    r = res.get("profiler")
    if not r:
        return []
    cost = r["device_activity_cost_us"]
    return [{"group": "profiler", "name": "add (8 elements)",
             "figure": "device activities' cost per task under torch.profiler (us)", "value": cost,
             "threshold": f"<= {DEVICE_COST_MAX_US}", "met": bool(cost <= DEVICE_COST_MAX_US)}]
