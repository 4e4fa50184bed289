"""Large operators: the neuron/CPU ratio where the kernel itself dominates.

Each case gives the bytes it must move (bandwidth-bound) or the flops it must
compute (compute-bound), so its rate is reported as a fraction of the limits
measured in limits.py. The time of one call includes, on neuron, the wait for
the device (issue + synchronize from an idle device).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .common import Config, compare

F32 = 4


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
        With sigmoid and tanh the chain is compute-bound on two cores; the
        arithmetic one (no transcendental functions) is bandwidth-bound."""
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

    cases = {f"add_{n // 2**20}M" if n >= 2**20 else f"add_{n}": (add, {"bytes": 3 * F32 * n})}
    for k in (4, 8):  # bytes: what a fully fused pass must move (two inputs, one output)
        cases[f"elementwise_chain{k}"] = (chain(k), {"bytes": 3 * F32 * n})
        cases[f"elementwise_chain{k}_arithmetic"] = (chain(k, arithmetic=True), {"bytes": 3 * F32 * n})
    for k in mm_sizes:
        cases[f"matmul_{k}"] = (mm(k), {"flops": 2 * k**3})
    cases["conv2d_resnet_layer2"] = (conv, {"flops": 2 * conv_b * 128 * conv_hw**2 * 128 * 9})
    cases["softmax"] = (softmax, {"bytes": 2 * F32 * rows * cols})
    cases["layer_norm"] = (layer_norm, {"bytes": 2 * F32 * rows * cols})
    cases["embedding"] = (embedding, {"bytes": 2 * F32 * tokens * dim})
    return cases


STEPS = 11  # cases in _cases


def run(cfg: Config, bar, limits: dict) -> dict:
    bw = limits["triad"]["gbytes_per_s"] * 1e9
    peak = limits["matmul"]["gflops"] * 1e9
    out = {}
    for name, (make, work) in _cases(cfg).items():
        r = compare(make, cfg, warmup=2)
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
