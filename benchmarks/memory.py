"""Peak memory of each end-to-end workload (build the model, run a few steps).

* neuron: the device allocator's counters. Before the run: synchronize,
  `torch.neuron.empty_cache()` (so reserved memory starts from what live
  tensors hold), `reset_peak_memory_stats()`. After: `max_memory_allocated`
  (peak bytes in live tensors) and `max_memory_reserved` (peak bytes the
  caching allocator held); their ratio is the allocator's overhead at peak.
* CPU: PyTorch keeps no CPU allocator statistics, so the peak is the growth
  of the process's peak resident set: free heap is returned to the OS
  (malloc_trim), the kernel's high-water mark is reset (`5` into
  /proc/self/clear_refs), and peak = VmHWM after - VmRSS before
  (examples/gpt_model.py: PeakMemory). It is page-granular and process-wide,
  so it also counts glibc's slack, Python objects and the CPU backend's
  scratch buffers; it is an upper bound of what tensors needed.
"""

from __future__ import annotations

import gc

import torch

from . import end_to_end as e2e
from .common import CPU, NEURON, Config, sync


def _workloads(cfg: Config) -> dict:
    return {"gpt_train_step": (e2e.gpt_train(cfg), 3),
            "resnet18_train_step": (e2e.resnet_train(cfg), 2),
            "gpt_infer_batch1_token": (e2e.gpt_infer(cfg, 4), 1)}


STEPS = 3


def _neuron_peak(build, k) -> dict:
    gc.collect()
    sync(NEURON)
    torch.neuron.empty_cache()
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.memory_allocated()
    step = build(NEURON)
    for _ in range(k):
        step()
    sync(NEURON)
    alloc, reserved = torch.neuron.max_memory_allocated(), torch.neuron.max_memory_reserved()
    del step
    gc.collect()
    return {"neuron_peak_allocated_bytes": alloc - base, "neuron_peak_reserved_bytes": reserved,
            "neuron_baseline_allocated_bytes": base, "reserved_over_allocated": reserved / max(alloc, 1)}


def _cpu_peak(build, k) -> dict:
    mem = e2e.gm.PeakMemory(CPU)
    mem.start()
    step = build(CPU)
    for _ in range(k):
        step()
    peak = mem.stop()
    del step
    gc.collect()
    return {"cpu_peak_bytes": peak, "cpu_peak_kind": mem.kind}


def run(cfg: Config, bar) -> dict:
    out = {}
    for name, (build, k) in _workloads(cfg).items():
        r = {"steps": k, **_neuron_peak(build, k), **_cpu_peak(build, k)}
        if r["cpu_peak_bytes"]:
            r["neuron_over_cpu"] = r["neuron_peak_allocated_bytes"] / r["cpu_peak_bytes"]
        out[name] = r
        bar.update(1)
    return out
