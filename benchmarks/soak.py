"""Soak: many training steps of the demo model (examples/gpt_model.py),
eager, fused (adaptive eager) and compiled, must keep the device allocator's
memory_allocated and memory_reserved and the process's resident set flat
after warm-up (at most 1% growth), with every allocator statistic consistent.

A group in benchmarks/run.py's sense (``STEPS``, ``run(cfg, bar)``,
``targets(res)``), and the measurement tests/test_soak.py asserts on. Steps
per mode: ``TORCHNEURON_SOAK_STEPS`` (default 1,000; smoke 20 of a one-layer model), after a tenth
of them (at least 30) of warm-up. The long run (docs/sanitizers.md):

    TORCHNEURON_SOAK_STEPS=10000 .venv/bin/python -m benchmarks.soak
"""
from __future__ import annotations

import gc
import math
import os
import sys

import torch

import torchneuron

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import gpt_model as gm  # noqa: E402

MODES = ("eager", "fused", "compiled")
STEPS = len(MODES)
GROWTH_MAX = 0.01
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def check_allocator_consistent(device=0) -> None:
    """Every statistic agrees with the others and with a snapshot of the segments."""
    torch.neuron.synchronize(device)
    s = torch.neuron.memory_stats(device)
    for name in ("allocation", "segment", "active", "allocated_bytes", "reserved_bytes", "active_bytes",
                 "requested_bytes", "inactive_split", "inactive_split_bytes"):
        for pool in ("all", "large_pool", "small_pool"):
            cur, peak = s[f"{name}.{pool}.current"], s[f"{name}.{pool}.peak"]
            assert 0 <= cur <= peak, (name, pool, cur, peak)
            if name not in ("inactive_split", "inactive_split_bytes"):  # derived on demand, not accumulated
                assert s[f"{name}.{pool}.allocated"] - s[f"{name}.{pool}.freed"] == cur, (name, pool)
        assert s[f"{name}.all.current"] == s[f"{name}.large_pool.current"] + s[f"{name}.small_pool.current"], name
    assert s["reserved_bytes.all.current"] >= s["active_bytes.all.current"] >= s["allocated_bytes.all.current"] \
        >= s["requested_bytes.all.current"]
    assert s["active.all.current"] >= s["allocation.all.current"]
    segments = [seg for seg in torch.neuron.memory_snapshot() if seg["device"] == device]
    assert len(segments) == s["segment.all.current"]
    assert sum(seg["total_size"] for seg in segments) == s["reserved_bytes.all.current"]
    assert sum(seg["allocated_size"] for seg in segments) == s["allocated_bytes.all.current"]
    assert sum(seg["active_size"] for seg in segments) == s["active_bytes.all.current"]
    assert sum(1 for seg in segments for b in seg["blocks"] if b["state"] == "active_allocated") \
        == s["allocation.all.current"]
    assert torch.neuron.memory_allocated(device) == s["allocated_bytes.all.current"]
    assert torch.neuron.memory_reserved(device) == s["reserved_bytes.all.current"]


def warmup_for(steps: int) -> int:
    # the executor's recycled launch records take a while to reach their sizes (docs/sanitizers.md)
    return max(30, steps // 10)


def soak(mode: str, steps: int, warmup: int, cfg: gm.GPTConfig, progress=None) -> dict:
    """`steps` training steps after `warmup`; memory at both ends and the growth."""
    model = gm.GPT(cfg, generator=torch.Generator().manual_seed(0)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    forward = torch.compile(model, backend="neuron") if mode == "compiled" else model
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(cfg.vocab_size, (8, cfg.block_size + 1), generator=g) for _ in range(4)]

    def step(i):
        b = batches[i % len(batches)].to("neuron")
        _, loss = forward(b[:, :-1], b[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        return loss

    def memory():
        gc.collect()
        check_allocator_consistent()
        return {"allocated": torch.neuron.memory_allocated(), "reserved": torch.neuron.memory_reserved(),
                "rss": rss_bytes()}

    torchneuron._C._set_adaptive_eager(mode != "eager")
    try:
        for i in range(warmup):
            step(i).item()
        start = memory()
        for i in range(warmup, warmup + steps):
            # The loss read every step, as a loop that logs it does: the host
            # runs at most a step ahead (records of queued work grow with the
            # deepest queue seen, a warm-up effect of its own).
            assert math.isfinite(step(i).item())
            if progress is not None:
                progress(1)
        end = memory()
    finally:
        torchneuron._C._set_adaptive_eager(True)
    growth = {k: end[k] / start[k] - 1 if start[k] else float(end[k] > 0) for k in start}
    return {"steps": steps, "warmup": warmup, "start": start, "end": end, "growth": growth}


def run(cfg, bar) -> dict:
    from tqdm import tqdm

    steps = int(os.environ.get("TORCHNEURON_SOAK_STEPS", "0")) or cfg.pick(1000, 20)
    out = {}
    for mode in MODES:
        with tqdm(total=steps, desc=f"soak {mode}", unit="step", leave=False, dynamic_ncols=True) as steps_bar:
            model = cfg.pick(gm.GPTConfig(), gm.GPTConfig(n_layer=1, d_model=64, block_size=32))
            out[mode] = soak(mode, steps, warmup_for(steps), model, progress=steps_bar.update)
        bar.update(1)
    return out


def targets(res: dict) -> list[dict]:
    rows = []
    for mode, r in res.get("soak", {}).items():
        worst = max(r["growth"].values())
        rows.append({"group": "soak", "name": f"{mode}, {r['steps']} steps after {r['warmup']}",
                     "figure": "largest growth of allocated, reserved and RSS", "value": worst,
                     "threshold": f"<= {GROWTH_MAX}", "met": bool(worst <= GROWTH_MAX)})
    return rows


def markdown(res: dict) -> str:
    s = ["## Soak (memory after warm-up)", "",
         "The demo model's training steps; memory at the first and last measured step "
         "(allocator statistics checked consistent at both).", "",
         "| mode | steps | allocated (start / end, MiB) | reserved (MiB) | RSS (MiB) | largest growth |",
         "|---|---|---|---|---|---|"]
    mib = 1 << 20
    for mode, r in res.items():
        a, b = r["start"], r["end"]
        s.append(f"| {mode} | {r['steps']} | {a['allocated'] / mib:.1f} / {b['allocated'] / mib:.1f} "
                 f"| {a['reserved'] / mib:.1f} / {b['reserved'] / mib:.1f} | {a['rss'] / mib:.1f} / {b['rss'] / mib:.1f} "
                 f"| {100 * max(r['growth'].values()):+.2f}% |")
    return "\n".join(s) + "\n"


if __name__ == "__main__":
    from benchmarks.common import run_alone

    run_alone("soak", run, targets, value_format=".4f")
