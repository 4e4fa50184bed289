"""The machine's physical limits, measured with the CPU backend.

* Memory bandwidth: a STREAM-style triad `a = b + s * c` (one fused
  `torch.add(b, c, alpha=s, out=a)`) on float32 tensors far larger than the
  caches; bytes moved = 3 arrays x 4 bytes x N (reads of b, c; write of a),
  as STREAM counts them. The best repeat is the limit, as STREAM reports it.
* Matmul peak: a large square float32 `torch.mm`, 2 n^3 flops; best repeat.
"""

from __future__ import annotations

import time

import torch

from .common import Config, median


def _best(fn, repeats: int) -> tuple[float, float]:
    fn()  # warm-up (page faults, thread pool)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), median(ts)


def triad(n: int):
    """The triad over `n` float32 elements, as a call (it holds its arrays)."""
    a, b, c = (torch.rand(n) for _ in range(3))
    return lambda: torch.add(b, c, alpha=3.0, out=a)


def run(cfg: Config, bar) -> dict:
    n = cfg.pick(64 * 2**20, 2**20)  # 64M floats: 256 MiB per array
    best, med = _best(triad(n), cfg.pick(10, 3))
    nbytes = 3 * 4 * n
    triad_figures = {"elements": n, "bytes": nbytes, "best_s": best, "median_s": med,
                     "gbytes_per_s": nbytes / best / 1e9, "gbytes_per_s_median": nbytes / med / 1e9}
    bar.update(1)

    m = cfg.pick(4096, 256)
    x, y = torch.randn(m, m), torch.randn(m, m)
    best, med = _best(lambda: torch.mm(x, y), cfg.pick(4, 2))
    flops = 2 * m**3
    mm = {"n": m, "flops": flops, "best_s": best, "median_s": med,
          "gflops": flops / best / 1e9, "gflops_median": flops / med / 1e9}
    bar.update(1)
    return {"triad": triad_figures, "matmul": mm}


STEPS = 2
