"""Host threads working on one device at once, every result checked against the CPU.

    python tests/thread_workloads.py --threads 4 --streams shared --kind warm --results 10000

prints one JSON line: results checked, results wrong (with the first few named), seconds. Run by
tests/test_threads.py in a fresh interpreter per configuration (first calls need one); the
command above is the long run (docs/sanitizers.md, "Host threads").

Kinds of work, each thread on inputs of its own:
  warm   signatures already called: element-wise chains on temporaries (lean, generic and fused
         sizes), the operators whose result sizes depend on data (mask indexing, nonzero, unique,
         masked_select), masked writes, copies to the device and back, values read, an MLP
         forward; each thread takes them in its own order
  first  every thread makes the first call of the same new call signature at the same moment
         (a barrier before each): operator x dtype x rank x layout, each run synchronously by the CPU
         kernel as first calls are, then queued work on its result
Streams: `shared` (every thread on the default stream) or `own` (a stream per thread).
"""
from __future__ import annotations

import argparse
import json
import threading
import time

import torch
import torch.nn.functional as F

import torchneuron  # noqa: F401

DEV = "neuron"
FUSABLE = 1 << 15  # fused sizes from here (the executor's floor is lowered to it)


def warm_cases(k: int):
    """(name, function of a device, the result) per case; inputs are thread k's own."""
    g = torch.Generator().manual_seed(1000 + k)
    small, large = torch.randn(4096, generator=g), torch.randn(2 * FUSABLE, generator=g)
    ints = torch.randint(0, 50, (3000,), generator=g)
    x, w1, w2 = torch.randn(16, 64, generator=g), torch.randn(128, 64, generator=g), torch.randn(32, 128, generator=g)
    host = torch.randn(777, generator=g)

    def on(dev):
        t = {"small": small, "large": large, "ints": ints, "x": x, "w1": w1, "w2": w2}
        return {n: v.to(dev) for n, v in t.items()}

    def masked_write(d):
        y = d["small"] * 2
        y[y > 0.5] = 0
        return y.sum()

    cases = [
        ("chain on temporaries", lambda d: ((d["small"] * 1.5 + 1).relu() * 2 - 3).sum()),
        ("fused chain", lambda d: ((d["large"] * 1.5 + 1).sigmoid() * 2 - 3).sum()),
        ("mask indexing", lambda d: d["small"][d["small"] > 0.1].sum()),
        ("nonzero", lambda d: torch.nonzero(d["small"] > 0).sum()),
        ("unique", lambda d: torch.unique(d["ints"] * 3 + 1)),
        ("masked_select", lambda d: torch.masked_select(d["small"] + 1, d["small"] < 0).sum()),
        ("masked write", masked_write),
        ("copy to the device", lambda d: (host.to(d["small"].device) * 3).sum()),
        ("copy to the host", lambda d: (d["small"] * 2 + 1).cpu()),
        ("value read", lambda d: torch.tensor((d["small"] * 4).sum().item())),
        ("mlp forward", lambda d: F.gelu(F.gelu(d["x"] @ d["w1"].T) @ d["w2"].T).sum(0)),
    ]
    cpu = on("cpu")
    return on, [(name, fn, fn(cpu)) for name, fn in cases]


UNARY = [torch.erf, torch.exp, torch.sin, torch.cos, torch.sigmoid, F.gelu, F.softplus, torch.atan, torch.asinh,
         torch.expm1, torch.log1p, torch.erfc, F.silu, torch.sinh, torch.abs, torch.neg, torch.square, torch.reciprocal]
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
LAYOUTS = ["contiguous", "transposed", "strided"]  # call signatures differ by layout class


def first_signatures():
    """New call signatures, in an order every thread shares: (operator, dtype, rank, layout)."""
    return [(op, dtype, rank, layout) for layout in LAYOUTS for rank in range(1, 6) for dtype in DTYPES
            for op in UNARY if not (layout == "transposed" and rank == 1)]


def first_case(k: int, op, dtype, rank: int, layout: str):
    g = torch.Generator().manual_seed(k * 7919 + rank)
    shape = (2, 3, 4, 5, 6)[:rank]
    cpu = torch.rand(shape, generator=g).to(dtype) * 0.9 + 0.05  # log1p, reciprocal: no edge values
    view = {"contiguous": lambda t: t, "transposed": lambda t: t.transpose(0, -1), "strided": lambda t: t[..., ::2]}
    return cpu, view[layout], op(view[layout](cpu)) + 1


def run(threads: int, streams: str, kind: str, results: int) -> dict:
    torchneuron._C._set_min_fusable_numel(FUSABLE)
    checked, wrong, examples = [0] * threads, [0] * threads, []
    barrier = threading.Barrier(threads)
    errors = []

    def check(k, name, got, want):
        checked[k] += 1
        got = got.cpu()
        same = got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
        if not same:
            wrong[k] += 1
            if len(examples) < 5:
                examples.append(f"thread {k}, {name}: {got.flatten()[:4].tolist()} for {want.flatten()[:4].tolist()}")

    def warm(k):
        on, cases = warm_cases(k)
        d = on(DEV)
        torch.neuron.synchronize()
        barrier.wait()
        i = 0
        while checked[k] < results // threads:
            name, fn, want = cases[(i * (k + 1) + k) % len(cases)]
            check(k, name, fn(d), want)
            i += 1

    def first(k):
        for op, dtype, rank, layout in first_signatures()[: max(1, results // threads)]:
            cpu, view, want = first_case(k, op, dtype, rank, layout)
            x = cpu.to(DEV)
            barrier.wait()
            check(k, f"first {op.__name__} {dtype} rank {rank} {layout}", op(view(x)) + 1, want)

    def thread(k):
        try:
            stream = torch.neuron.Stream() if streams == "own" else torch.neuron.default_stream()
            with torch.neuron.stream(stream):
                (warm if kind == "warm" else first)(k)
        except BaseException as e:  # noqa: BLE001 - reported, and the barrier released
            errors.append(f"thread {k}: {type(e).__name__}: {e}")
            barrier.abort()

    if kind == "warm":  # every signature called once, before the threads
        on, cases = warm_cases(0)
        d = on(DEV)
        for _, fn, _ in cases:
            fn(d).cpu()
    start = time.perf_counter()
    pool = [threading.Thread(target=thread, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    torch.neuron.synchronize()
    return {"threads": threads, "streams": streams, "kind": kind, "checked": sum(checked), "wrong": sum(wrong),
            "examples": examples, "errors": errors, "seconds": round(time.perf_counter() - start, 2)}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--streams", choices=("shared", "own"), default="shared")
    p.add_argument("--kind", choices=("warm", "first"), default="warm")
    p.add_argument("--results", type=int, default=1000, help="results to check, over all threads")
    a = p.parse_args()
    print(json.dumps(run(a.threads, a.streams, a.kind, a.results)))
