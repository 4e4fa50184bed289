"""FlexAttention with a causal block mask at a small LLM's attention shape: eager flex
(the math implementation, scores materialised) and compiled flex (Inductor's C++ flex
template) on the CPU and on neuron, in this process, alternating devices repeat by
repeat, medians; and a training step's attention (forward and backward) on neuron,
eager against compiled (the CPU has no flex backward to compare with).

    .venv/bin/python -m benchmarks.flex_attention [--smoke]
"""
from __future__ import annotations

import time
import warnings

import torch
from torch.nn.attention import flex_attention as fa

from .common import CPU, NEURON, Config, compare, fmt_time, median, timed

STEPS = 3  # eager, compiled, training


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def shape(cfg: Config) -> dict:
    # batch, query heads, key/value heads (GQA), sequence, head dimension
    return cfg.pick(dict(B=1, H=8, Hkv=2, L=1024, D=64), dict(B=1, H=2, Hkv=1, L=128, D=16))


def _inputs(cfg: Config, device: torch.device, requires_grad: bool = False):
    s = shape(cfg)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(s["B"], s["H"], s["L"], s["D"], generator=g)
    k, v = (torch.randn(s["B"], s["Hkv"], s["L"], s["D"], generator=g) for _ in range(2))
    block_mask = fa.create_block_mask(_causal, None, None, s["L"], s["L"], device=device)
    return [t.to(device).requires_grad_(requires_grad) for t in (q, k, v)], block_mask


def run(cfg: Config, bar) -> dict:
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    out = {"shape": shape(cfg)}

    def eager(device):
        (q, k, v), bm = _inputs(cfg, device)
        return lambda: fa.flex_attention(q, k, v, block_mask=bm, enable_gqa=True)

    with torch.no_grad():
        out["eager_forward"] = compare(eager, cfg)
    bar.update(1)

    compiled, compile_s = {}, {}

    def make_compiled(device):
        (q, k, v), bm = _inputs(cfg, device)
        flex = torch.compile(fa.flex_attention, backend="neuron" if device.type == "neuron" else "inductor")
        t0 = time.perf_counter()
        compiled[device.type] = flex(q, k, v, block_mask=bm, enable_gqa=True)
        compile_s[device.type] = time.perf_counter() - t0
        return lambda: flex(q, k, v, block_mask=bm, enable_gqa=True)

    with torch.no_grad():
        out["compiled_forward"] = compare(make_compiled, cfg)
        # a speed figure of a wrong computation is no figure: the two run the same C++ template
        assert torch.equal(compiled["neuron"].cpu(), compiled["cpu"]), "compiled neuron differs from compiled CPU"
    out["first_call_s"] = compile_s
    bar.update(1)

    (q, k, v), bm = _inputs(cfg, NEURON, requires_grad=True)
    grad = torch.randn_like(q)
    steps = {}
    for name, flex in (("eager", fa.flex_attention), ("compiled", torch.compile(fa.flex_attention, backend="neuron"))):
        def step(flex=flex):
            o = flex(q, k, v, block_mask=bm, enable_gqa=True)
            o.backward(grad)
            return o
        timed(step, NEURON)  # warm-up (the compilation, for the compiled one)
        steps[name] = step
    samples = {name: [] for name in steps}
    for _ in range(cfg.repeats):
        for name, step in steps.items():
            samples[name].append(timed(step, NEURON))
    out["neuron_training"] = {f"{name}_s": median(s) for name, s in samples.items()} | \
        {f"{name}_samples_s": s for name, s in samples.items()}
    bar.update(1)
    return out


def markdown(r: dict) -> str:
    s = r["shape"]
    rows = [("eager (math, scores materialised)", r["eager_forward"]),
            ("compiled (Inductor's C++ flex template)", r["compiled_forward"])]
    lines = [
        "## FlexAttention",
        "",
        f"Causal block mask, batch {s['B']}, {s['H']} query heads over {s['Hkv']} key/value heads (GQA), "
        f"sequence {s['L']}, head dimension {s['D']}, float32; forward under `no_grad`, per call, completed, "
        "medians (`benchmarks/flex_attention.py`; devices alternate repeat by repeat). Compiled neuron's "
        "output equals compiled CPU's bit for bit (checked by the run).",
        "",
        "| flex_attention | CPU | neuron | neuron / CPU |",
        "|---|---|---|---|",
    ]
    for name, c in rows:
        lines.append(f"| {name} | {fmt_time(c['cpu_s'])} | {fmt_time(c['neuron_s'])} | {c['ratio_time']:.2f} |")
    first = r["first_call_s"]
    t = r["neuron_training"]
    lines += [
        "",
        f"First compiled call (compilation included): neuron {fmt_time(first['neuron'])}, then CPU "
        f"{fmt_time(first['cpu'])} (it finds the same C++ kernel in Inductor's cache). Training (forward and backward of the attention, neuron only: PyTorch "
        f"has no flex backward on the CPU): eager {fmt_time(t['eager_s'])}, compiled (dense decomposition, "
        f"patch `inductor-flex-dense`) {fmt_time(t['compiled_s'])}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    from .common import run_alone

    run_alone("flex_attention", run, lambda res: [])
