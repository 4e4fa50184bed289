"""torch.compile: compiled `neuron` against Inductor on the CPU backend, against
eager `neuron`, and mode="reduce-overhead" against the default mode, all in
this process on the same models, weights and batches; plus first-compile and
cached-compile latency, each measured in a fresh subprocess with its own
Inductor cache directory (cold, then reused by a second subprocess).

Training steps compile the model's forward (AOTAutograd compiles its
backward); the optimizer step (SGD, foreach) stays eager, the same for all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from .common import CPU, NEURON, Config, median, timed
from .end_to_end import gpt_sizes

import gpt_model as gm  # noqa: E402  (on sys.path via .common)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# variant -> (device, torch.compile keyword arguments or None for eager)
VARIANTS = {
    "cpu_inductor": (CPU, {"backend": "inductor"}),
    "neuron_eager": (NEURON, None),
    "neuron_compiled": (NEURON, {"backend": "neuron"}),
    "neuron_reduce_overhead": (NEURON, {"backend": "neuron", "mode": "reduce-overhead"}),
}


class ConvNet(nn.Module):
    def __init__(self, width: int, classes: int = 10):
        super().__init__()
        w = width
        self.features = nn.Sequential(
            nn.Conv2d(3, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(w, 2 * w, 3, padding=1), nn.BatchNorm2d(2 * w), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(2 * w, classes)

    def forward(self, x):
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def mlp(width: int, depth: int) -> nn.Module:
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width)]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def workloads(cfg: Config) -> dict:
    """name -> (make_model(), inputs, targets, loss(model, x, y)), built on the CPU."""
    g = torch.Generator().manual_seed(1)
    ce = lambda m, x, y: F.cross_entropy(m(x), y)  # noqa: E731
    if cfg.smoke:
        return {"mlp": (lambda: mlp(16, 2), torch.randn(4, 16, generator=g), torch.randint(10, (4,), generator=g), ce)}
    mc, tc = gpt_sizes(cfg)
    return {
        # many small kernels: where per-kernel host cost shows
        "mlp": (lambda: mlp(256, 4), torch.randn(64, 256, generator=g), torch.randint(10, (64,), generator=g), ce),
        "convnet": (lambda: ConvNet(16), torch.randn(16, 3, 32, 32, generator=g),
                    torch.randint(10, (16,), generator=g), ce),
        "gpt": (lambda: gm.GPT(mc, generator=torch.Generator().manual_seed(0)),
                torch.randint(mc.vocab_size, (tc.batch_size, mc.block_size), generator=g),
                torch.randint(mc.vocab_size, (tc.batch_size, mc.block_size), generator=g),
                lambda m, x, y: m(x, y)[1]),
    }


def build(workload, variant: str, train: bool):
    make, x, y, loss_fn = workload
    device, kw = VARIANTS[variant]
    torch.manual_seed(0)
    model = make().to(device)
    x, y = x.to(device), y.to(device)
    fwd = torch.compile(model, **kw) if kw else model
    if not train:
        model.eval()

        @torch.no_grad()
        def infer():
            return fwd(x)
        infer.model = model
        return infer
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=True)

    def step():
        loss = loss_fn(fwd, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    step.model = model
    return step


def check_agreement(workload: str, fns: dict, rtol: float = 1e-4) -> None:
    """After the same calls on every variant (same initial weights, same batches): each variant's
    weights and buffers, and an inference's output, agree with Inductor's on the CPU. A speed figure
    of a wrong computation is no figure; this is how the benchmark would see one."""
    def state(fn):
        out = dict(fn.model.state_dict())
        if not fn.model.training:
            leaves = torch.utils._pytree.tree_leaves(fn())
            out |= {f"output {i}": t for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)}
        return out

    with torch.no_grad():
        expected = state(fns["cpu_inductor"])
        for variant, fn in fns.items():
            for key, have in state(fn).items():
                want = expected[key].double()
                err = (have.cpu().double() - want).abs().max().item()
                if err > rtol * (1 + want.abs().max().item()):
                    raise AssertionError(f"compiled benchmark {workload}: {variant}'s {key} differs from "
                                         f"Inductor's on the CPU by {err:.3g}")


def _run_all(fns: dict, steps: int, repeats: int) -> dict:
    """Medians per step, variants alternating repeat by repeat."""
    for name, fn in fns.items():   # compile, warm up, record (reduce-overhead) outside the timings
        for _ in range(3):
            timed(fn, VARIANTS[name][0])
    samples = {n: [] for n in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(timed(lambda: [fn() for _ in range(steps)], VARIANTS[name][0]) / steps)
    return {n: {"s": median(v), "samples_s": v} for n, v in samples.items()}


def _host_per_call(fn, device, calls: int) -> float:
    """Host time to issue one call while the device is still busy with
    earlier work (so the executor is not competing for the host's time)."""
    a = torch.randn(512, 512, device=device)
    out = []
    for _ in range(calls):
        torch.neuron.synchronize()
        busy = [a @ a for _ in range(4)]   # several ms of queued device work
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        del busy
    torch.neuron.synchronize()
    return median(out)


# -- compile latency: fresh subprocesses -------------------------------------------

_LATENCY_SCRIPT = textwrap.dedent("""
    import json, sys, time
    t_start = time.perf_counter()
    import torch, torchneuron, torchneuron.compile
    sys.path[:0] = [{root!r}, {examples!r}]
    from benchmarks.common import Config
    from benchmarks import compiled
    device = {device!r}
    torch.empty(1, device="neuron")
    w = compiled.workloads(Config(smoke=False))[{workload!r}]
    step = compiled.build(w, {variant!r}, train=True)
    t0 = time.perf_counter()
    step()
    torch.accelerator.synchronize() if device == "neuron" else None
    t1 = time.perf_counter()
    from torch._dynamo.utils import counters
    print("RESULT", json.dumps({{"first_call_s": t1 - t0, "process_s": t1 - t_start,
          "fxgraph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
          "fxgraph_cache_miss": counters["inductor"]["fxgraph_cache_miss"]}}))
""")


def compile_latency(workload: str, variant: str, timeout: int = 1200) -> dict:
    """First call (compile included) of a training step in a fresh process
    with an empty cache directory, then in a second fresh process reusing it."""
    device = VARIANTS[variant][0].type
    script = _LATENCY_SCRIPT.format(root=ROOT, examples=os.path.join(ROOT, "examples"), device=device,
                                    workload=workload, variant=variant)
    out = {}
    with tempfile.TemporaryDirectory(prefix="tn_compile_bench_") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "PYTHONPATH": ROOT}
        for phase in ("cold", "cached"):
            p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                               timeout=timeout)
            if p.returncode != 0:
                raise RuntimeError(f"compile latency {variant} {phase}: {p.stderr[-2000:]}")
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
            out[phase] = json.loads(line[len("RESULT "):])
    return out


# -- the group -------------------------------------------------------------------

def _modes(cfg):
    return ("infer", "train") if not cfg.smoke else ("infer",)


STEPS = 4   # progress units: throughput (per workload) + compile latency, see run()


def run(cfg: Config, bar) -> dict:
    ws = workloads(cfg)
    steps, repeats = cfg.pick(5, 1), cfg.repeats
    out = {"workloads": {}}
    per_workload = (STEPS - 1) / len(ws)
    for name, w in ws.items():
        for mode in _modes(cfg):
            torch._dynamo.reset()
            fns = {v: build(w, v, train=(mode == "train")) for v in VARIANTS}
            r = _run_all(fns, steps, repeats)
            check_agreement(f"{name}_{mode}", fns)
            s = {v: r[v]["s"] for v in VARIANTS}
            r["compiled_speed_vs_cpu_inductor"] = s["cpu_inductor"] / s["neuron_compiled"]
            r["best_speed_vs_cpu_inductor"] = s["cpu_inductor"] / min(s["neuron_compiled"],
                                                                       s["neuron_reduce_overhead"])
            r["compiled_speed_vs_eager"] = s["neuron_eager"] / s["neuron_compiled"]
            r["reduce_overhead_speed_vs_default"] = s["neuron_compiled"] / s["neuron_reduce_overhead"]
            if not cfg.smoke:
                r["host_per_call_s"] = {v: _host_per_call(fns[v], NEURON, cfg.pick(15, 2))
                                        for v in ("neuron_eager", "neuron_compiled", "neuron_reduce_overhead")}
            out["workloads"][f"{name}_{mode}"] = r
        bar.update(per_workload)
    from torchneuron.compile import replay
    out["replay_stats"] = dict(replay.stats)
    out["replay_reasons"] = dict(replay.reasons)
    if not cfg.smoke:   # fresh subprocesses, each compiling from an empty cache: minutes
        out["compile_latency"] = {"workload": "gpt_train",
                                  "neuron": compile_latency("gpt", "neuron_compiled"),
                                  "cpu_inductor": compile_latency("gpt", "cpu_inductor")}
    bar.update(1)
    return out
