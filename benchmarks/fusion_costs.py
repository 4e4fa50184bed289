"""Measures the constants of adaptive eager's cost model
(csrc/bridge/fusion/cost_model.cpp) on this host, and the size floor they
imply. Run alone, on a quiet machine if there is one:

    .venv/bin/python -m benchmarks.fusion_costs

Each figure is a median over interleaved repeats in this one process:
* task_s: a device task's cost beyond its kernel's work: K sigmoid tasks
  queued (fusion off) behind a matrix product, so the device runs them back
  to back, at 1K and 64K floats; the intercept at 0 elements.
* piece_call_s: one ATen kernel call, the cost a fused member pays per extra
  piece: the same intercept for sigmoid's CPU time on one thread, less
  Python's own cost of a call.
* host_call_s: the host's cost of issuing one element-wise operator that may
  fuse (the boxed path and the fuser's planning), timed while the device is
  busy.
* memory_bytes_per_s: the triad's bandwidth over 16M floats (limits.py);
  shared_bytes_per_s: over 256K floats (3 MB), which stay in the last-level
  cache.
* cache_bytes: half a core's L2, as the OS reports it: a piece's working set
  shares it with the kernels' own data; shared_cache_bytes: the L3.
The floor (torchneuron._C._min_fusable_numel): the smallest power of two N
from which a device task of N floats (two read, one written) takes at least
what the host needs to issue it; below it the device waits for the host,
nothing queues, and fusion cannot happen.
"""

from __future__ import annotations

import os
import time

import torch

import torchneuron

from .common import median
from .limits import triad

K = 200  # tasks per measurement
SMALL, LARGE = 1 << 10, 1 << 16  # elements per task: the intercept of a fit over the two


def _device_time_per_op(n: int, on: bool) -> tuple[float, float]:
    """Device seconds per queued sigmoid of n floats (queued behind a matrix
    product, so the device runs them back to back), and the host's seconds to
    issue one."""
    torchneuron._C._set_adaptive_eager(on)
    try:
        x = torch.randn(n, device="neuron")
        a = torch.ones(1024, 1024, device="neuron")
        torch.neuron.synchronize()
        t0 = time.perf_counter()
        busy = a @ a
        torch.neuron.synchronize()
        t_busy = time.perf_counter() - t0
        t0 = time.perf_counter()
        busy = a @ a
        ys = [torch.sigmoid(x) for _ in range(K)]
        t_issued = time.perf_counter() - t0
        torch.neuron.synchronize()
        total = time.perf_counter() - t0
        del busy, ys
        return (total - t_busy) / K, t_issued / K
    finally:
        torchneuron._C._set_adaptive_eager(True)


def _intercept(f_small: float, f_large: float) -> float:
    return f_small - (f_large - f_small) / (LARGE - SMALL) * SMALL


def _call_intercept() -> float:
    """ATen's per-call cost: sigmoid's CPU time on one thread at 0 elements,
    extrapolated from two sizes, less the cost of a bare call from Python."""
    def per_call(n):
        x, out = torch.randn(n), torch.empty(n)
        for _ in range(20):
            torch.sigmoid(x, out=out)
        t0 = time.perf_counter()
        for _ in range(500):
            torch.sigmoid(x, out=out)
        return (time.perf_counter() - t0) / 500
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        intercept = _intercept(per_call(SMALL), per_call(LARGE))
    finally:
        torch.set_num_threads(threads)
    x = torch.randn(4)
    t0 = time.perf_counter()
    for _ in range(500):
        x.dim()
    return max(intercept - (time.perf_counter() - t0) / 500, 0.0)


def _cache_bytes(index: int) -> int:
    path = f"/sys/devices/system/cpu/cpu0/cache/index{index}/size"
    with open(path) as f:
        text = f.read().strip()
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1)
    return int(text.rstrip("KM")) * scale


def measure(repeats: int = 7) -> dict:
    tasks, hosts, calls, bws, shared = [], [], [], [], []
    tr, tr_shared = triad(16 * 2**20), triad(2**18)
    floor = torchneuron._C._min_fusable_numel()
    torchneuron._C._set_min_fusable_numel(LARGE)  # the large calls take the fuser's path
    for _ in range(2):  # warm: first calls of a signature run synchronously
        _device_time_per_op(SMALL, False), _device_time_per_op(LARGE, False), _device_time_per_op(LARGE, True), tr()
    for _ in range(repeats):
        tasks.append(_intercept(_device_time_per_op(SMALL, False)[0], _device_time_per_op(LARGE, False)[0]))
        hosts.append(_device_time_per_op(LARGE, True)[1])
        calls.append(_call_intercept())
        t0 = time.perf_counter()
        tr()
        bws.append(3 * 4 * 16 * 2**20 / (time.perf_counter() - t0))
        tr_shared()
        t0 = time.perf_counter()
        for _ in range(20):
            tr_shared()
        shared.append(20 * 3 * 4 * 2**18 / (time.perf_counter() - t0))
    r = {"task_s": median(tasks), "piece_call_s": median(calls), "host_call_s": median(hosts),
         "memory_bytes_per_s": median(bws), "shared_bytes_per_s": median(shared),
         "cache_bytes": _cache_bytes(2) // 2, "shared_cache_bytes": _cache_bytes(3), "load": os.getloadavg()[0]}
    torchneuron._C._set_min_fusable_numel(floor)
    n = 1 << 10
    while r["task_s"] + 12 * n / r["memory_bytes_per_s"] < r["host_call_s"]:
        n *= 2
    r["floor_numel"] = n
    return r


if __name__ == "__main__":
    r = measure()
    print(f"task_s={r['task_s']:.2e} piece_call_s={r['piece_call_s']:.2e} host_call_s={r['host_call_s']:.2e} "
          f"memory_bytes_per_s={r['memory_bytes_per_s']:.3g} shared_bytes_per_s={r['shared_bytes_per_s']:.3g} "
          f"cache_bytes={r['cache_bytes']} shared_cache_bytes={r['shared_cache_bytes']} "
          f"floor_numel={r['floor_numel']} (load average {r['load']:.2f})")
