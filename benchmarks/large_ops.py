"""Large operators: the neuron/CPU ratio where the kernel itself dominates.

Each case gives the bytes it must move (bandwidth-bound) or the flops it must
compute (compute-bound), so its rate is reported as a fraction of the limits
measured in limits.py. The time of one call includes, on neuron, the wait for
the device (issue + synchronize from an idle device).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

import torchneuron

from .common import CPU, NEURON, Config, compare, median, timed
from .limits import triad

F32 = 4
CHAINS = "elementwise_chain"  # the fused chains' names begin so


def _cases(cfg: Config) -> dict:
    """name -> (make(device) -> fn, {"bytes": ..} or {"flops": ..})."""
    n = cfg.pick(16 * 2**20, 2**16)           # 16M elements
    mm_sizes = cfg.pick((1024, 2048), (64, 128))
    conv_b, conv_hw = cfg.pick((16, 28), (2, 8))  # ResNet-18 layer2: 128 ch, 28x28
    rows, cols = cfg.pick((4096, 4096), (64, 256))
    vocab, dim, tokens = cfg.pick((32768, 512, 32768), (512, 64, 256))

    def data(*shape, device, seed=0):
        return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device)

    def add(d):
        a, b = data(n, device=d), data(n, device=d, seed=1)
        return lambda: a + b

    def mm(k):
        def make(d):
            a, b = data(k, k, device=d), data(k, k, device=d, seed=1)
            return lambda: a @ b
        return make

    def conv(d):
        x, w = data(conv_b, 128, conv_hw, conv_hw, device=d), data(128, 128, 3, 3, device=d, seed=1)
        return lambda: F.conv2d(x, w, padding=1)

    def softmax(d):
        x = data(rows, cols, device=d)
        return lambda: torch.softmax(x, dim=-1)

    def layer_norm(d):
        x, w, b = data(rows * 4, cols // 4, device=d), data(cols // 4, device=d), data(cols // 4, device=d)
        return lambda: F.layer_norm(x, (cols // 4,), w, b)

    def embedding(d):
        w = data(vocab, dim, device=d)
        idx = torch.randint(vocab, (tokens,), generator=torch.Generator().manual_seed(2)).to(d)
        return lambda: F.embedding(idx, w)

    def chain(k, arithmetic=False):
        """k element-wise ops in a row: what adaptive eager fuses on neuron.
        With sigmoid and tanh the chain is close to compute-bound on two
        cores; the arithmetic one (no transcendental functions) is
        bandwidth-bound."""
        def make(d):
            a, b = data(n, device=d), data(n, device=d, seed=1)
            steps = [lambda t: t * 1.5, torch.relu, lambda t: t + b, torch.sigmoid,
                     lambda t: t - 0.25, torch.tanh, lambda t: t * b, torch.neg][:k]
            if arithmetic:
                steps = [lambda t: t * 1.5, torch.relu, lambda t: t + b, lambda t: t.clamp(-2, 2),
                         lambda t: t - 0.25, torch.abs, lambda t: t * b, torch.neg][:k]

            def run():
                t = a
                for step in steps:
                    t = step(t)
                return t
            return run
        return make

    def dag(d):
        """An element-wise DAG: x read four times, a residual add, sigmoid
        and tanh. Two arrays' worth of ideal bytes: x in, the result out."""
        x = data(n, device=d)

        def run():
            y = ((x * 1.5 + 0.25).relu() * x).sigmoid() + x * 0.5
            return torch.tanh(y) * 2 - x
        return run

    cases = {f"add_{n // 2**20}M" if n >= 2**20 else f"add_{n}": (add, {"bytes": 3 * F32 * n})}
    for k in (4, 8):  # bytes: what a fully fused pass must move (two inputs, one output)
        # the members computed as ATen's kernels compute them (tanh is the CPU's, MKL's,
        # unless TORCHNEURON_DEVICE_TANH=1 makes it the device's own, computed in the chain)
        library = [torch.sigmoid] + [torch.tanh] * (k == 8 and not torchneuron._C._device_tanh())
        cases[f"{CHAINS}{k}"] = (chain(k), {"bytes": 3 * F32 * n, "elements": n, "library": library})
        cases[f"{CHAINS}{k}_arithmetic"] = (chain(k, arithmetic=True),
                                            {"bytes": 3 * F32 * n, "elements": n, "library": []})
    cases[f"{CHAINS}_dag"] = (dag, {"bytes": 2 * F32 * n, "elements": n,
                                    "library": [torch.sigmoid] + [torch.tanh] * (not torchneuron._C._device_tanh())})
    for k in mm_sizes:
        cases[f"matmul_{k}"] = (mm(k), {"flops": 2 * k**3})
    cases["conv2d_resnet_layer2"] = (conv, {"flops": 2 * conv_b * 128 * conv_hw**2 * 128 * 9})
    cases["softmax"] = (softmax, {"bytes": 2 * F32 * rows * cols})
    cases["layer_norm"] = (layer_norm, {"bytes": 2 * F32 * rows * cols})
    cases["embedding"] = (embedding, {"bytes": 2 * F32 * tokens * dim})
    return cases


STEPS = 12 + 1  # cases in _cases, and the chains on the AVX2 path (run_avx2_path)


def _library_floor_s(fns, elements: int) -> float:
    """Seconds that ATen's own CPU kernels of `fns` (sigmoid) would take
    for `elements` elements on data in cache, split perfectly over the intra-op
    threads (timed on one): a floor for any pass that must compute them bit
    for bit as ATen does, memory aside."""
    x = torch.randn(128 * 1024, generator=torch.Generator().manual_seed(3))  # 512 KiB: in one core's L2
    out = torch.empty_like(x)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        total = 0.0
        for fn in fns:
            for _ in range(5):
                fn(x, out=out)
            total += min(timed(lambda: fn(x, out=out), CPU) for _ in range(21)) / x.numel() * elements
    finally:
        torch.set_num_threads(threads)
    return total / threads


def _chain_against_triad(make, elements: int, nbytes: int, library, repeats: int) -> dict:
    """The fused chain's time against a triad over the same elements (the same
    ideal bytes), measured beside it repeat by repeat: the machine's bandwidth
    drifts by up to 2x within minutes, so limits.py's figure from the start of
    the run is no fair measure of a chain timed minutes later. Both are the
    best of three calls in a row, as limits.py times its triad: the first call
    after the cores sat idle runs slow (16M floats, chain8 after 0.2 s idle:
    12.3 ms, then 11.0 and 10.6). A chain that moves fewer ideal bytes than
    the triad's three arrays (the DAG's two) counts its own."""
    chain, beside = make(NEURON), triad(elements)
    share = nbytes / (3 * F32 * elements)  # of the triad's bytes
    fractions, floors = [], []
    for _ in range(repeats):
        t_chain = min(timed(chain, NEURON) for _ in range(3))
        t_triad = min(timed(beside, CPU) for _ in range(3))
        fractions.append(share * t_triad / t_chain)
        if library:
            floors.append(share * t_triad / _library_floor_s(library, elements))
    # The instruction set fusion's loops ran on (ATEN_CPU_CAPABILITY can force
    # a lower one) and the highest the host has.
    r = {"fraction_of_triad_alongside": median(fractions), "isa": torchneuron._C._isa(),
         "aten_cpu_capability": torch.backends.cpu.get_cpu_capability()}
    if library:
        r["library"] = [f.__name__ for f in library]
        r["library_floor_fraction_of_triad"] = median(floors)  # the most that floor allows
    return r


def run(cfg: Config, bar, limits: dict, only=None) -> dict:
    bw = limits["triad"]["gbytes_per_s"] * 1e9
    peak = limits["matmul"]["gflops"] * 1e9
    out = {}
    for name, (make, work) in _cases(cfg).items():
        if only and not only(name):
            continue
        r = compare(make, cfg, warmup=2)
        if "library" in work:
            work = dict(work)
            r.update(_chain_against_triad(make, work.pop("elements"), work["bytes"], work.pop("library"), cfg.repeats))
        r.update(work)
        for dev in ("neuron", "cpu"):
            if "bytes" in work:
                r[f"{dev}_gbytes_per_s"] = work["bytes"] / r[f"{dev}_s"] / 1e9
                r[f"{dev}_fraction_of_bandwidth"] = work["bytes"] / r[f"{dev}_s"] / bw
            else:
                r[f"{dev}_gflops"] = work["flops"] / r[f"{dev}_s"] / 1e9
                r[f"{dev}_fraction_of_peak"] = work["flops"] / r[f"{dev}_s"] / peak
        out[name] = r
        bar.update(1)
    return out


def run_avx2_path(cfg: Config, bar) -> dict:
    """The fused chains again on the AVX2 path, forced on a host with a higher
    level as a user would force it (ATEN_CPU_CAPABILITY=avx2), in a child
    interpreter: a process chooses its level once (isa.h). Empty on a host
    whose own level is AVX2 or lower: its native run is that path."""
    if torchneuron._C._isa()["host"] != "avx512":
        bar.update(1)
        return {}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "chains.json")
        subprocess.run([sys.executable, "-m", "benchmarks.large_ops", "--json", out] + ["--smoke"] * cfg.smoke,
                       cwd=root, env={**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}, check=True,
                       stdout=subprocess.DEVNULL)
        with open(out) as f:
            result = json.load(f)
    assert all(r["isa"]["path"] == "avx2" for r in result.values()), "the child did not run the AVX2 path"
    bar.update(1)
    return result


if __name__ == "__main__":
    # The fused chains alone, with their targets:
    #   python -m benchmarks.large_ops [--smoke] [--json FILE]    (ATEN_CPU_CAPABILITY=avx2 forces the AVX2 path)
    from . import limits as machine_limits
    from . import report
    from .common import run_alone

    def chains(cfg, bar):
        torch.empty(1, device="neuron")
        lim = machine_limits.run(cfg, bar)
        return run(cfg, bar, lim, only=lambda name: name.startswith(CHAINS))

    run_alone("large_ops", chains, lambda res: [t for t in report.targets(res) if t["group"] == "fusion"])
