"""Where adaptive eager fuses in real training: the demo GPT's training step,
its transformer block and an LSTM cell (forward and backward), at the demo's
sizes, with what fusion did in one step and the step's time with fusion on
and off."""

from __future__ import annotations

import torch
import torch.nn as nn

import torchneuron

from .common import CPU, NEURON, Config, fused_in_one_step, median, timed
from .end_to_end import gpt_sizes, gpt_train

import gpt_model as gm  # noqa: E402  (on sys.path via .common)


def block_train(cfg: Config):
    """The demo GPT's transformer block (examples/gpt_model.py) on a batch of
    the demo's activations: forward, backward."""
    mc, tc = gpt_sizes(cfg)

    def build(device):
        torch.manual_seed(0)
        block = gm.Block(mc).to(device)
        x = torch.randn(tc.batch_size, mc.block_size, mc.d_model, generator=torch.Generator().manual_seed(1))
        x = x.to(device).requires_grad_()

        def step():
            block(x).square().mean().backward()
            return x.grad
        return step
    return build


def lstm_cell_sizes(cfg: Config):
    return cfg.pick(dict(batch=64, hidden=512, steps=8), dict(batch=64, hidden=512, steps=2))


def lstm_cell_train(cfg: Config):
    """An LSTM cell unrolled over a few steps, written as the cell's equations
    (as in custom recurrent models): forward, backward."""
    s = lstm_cell_sizes(cfg)

    def build(device):
        torch.manual_seed(0)
        gates = nn.Linear(2 * s["hidden"], 4 * s["hidden"]).to(device)
        g = torch.Generator().manual_seed(1)
        xs = torch.randn(s["steps"], s["batch"], s["hidden"], generator=g).to(device)

        def step():
            h = c = torch.zeros(s["batch"], s["hidden"], device=device)
            for x in xs:
                i, f, u, o = gates(torch.cat((x, h), 1)).chunk(4, 1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(u)
                h = torch.sigmoid(o) * torch.tanh(c)
            h.square().mean().backward()
            return gates.weight.grad
        return step
    return build


WORKLOADS = {"gpt_train_step": gpt_train, "transformer_block_train_step": block_train, "lstm_cell_train_step": lstm_cell_train}
STEPS = len(WORKLOADS)


def on_off_cpu(build, cfg: Config, warmup: int = 2) -> dict:
    """Seconds per step on neuron with fusion on, with it off, and on the CPU:
    medians of repeats that interleave the three."""
    steps = {"on": build(NEURON), "off": build(NEURON), "cpu": build(CPU)}

    def time_one(kind):
        torchneuron._C._set_adaptive_eager(kind != "off")
        try:
            return timed(steps[kind], CPU if kind == "cpu" else NEURON)
        finally:
            torchneuron._C._set_adaptive_eager(True)

    for kind in steps:
        for _ in range(warmup):
            time_one(kind)
    samples = {kind: [] for kind in steps}
    for _ in range(cfg.repeats):
        for kind in steps:
            samples[kind].append(time_one(kind))
    on, off, cpu = (median(samples[k]) for k in ("on", "off", "cpu"))
    return {"neuron_s": on, "neuron_fusion_off_s": off, "cpu_s": cpu, "fusion_speedup": off / on,
            "speed_vs_cpu": cpu / on}


def run(cfg: Config, bar=None) -> dict:
    out = {}
    for name, workload in WORKLOADS.items():
        build = workload(cfg)
        out[name] = {**on_off_cpu(build, cfg), **fused_in_one_step(build(NEURON))}
        if bar:
            bar.update(1)
    return out


if __name__ == "__main__":
    import os

    for name, r in run(Config()).items():
        print(f"{name}: fused tasks {r['fused_tasks_per_step']} of {r['fused_ops_per_step']} operators, "
              f"{r['elided_intermediates_per_step']} never written; neuron {r['neuron_s'] * 1e3:.2f} ms "
              f"(fusion off {r['neuron_fusion_off_s'] * 1e3:.2f} ms, on is {r['fusion_speedup']:.2f}x), "
              f"CPU {r['cpu_s'] * 1e3:.2f} ms (load average {os.getloadavg()[0]:.2f})")
