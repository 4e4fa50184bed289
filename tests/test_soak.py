"""Soak test: many training steps of the demo model (examples/gpt_model.py),
eager, fused (adaptive eager) and compiled, keep the device allocator's
memory_allocated and memory_reserved and the process's resident set flat
after warm-up (at most 1% growth), with every allocator statistic consistent.

CI runs a short version (a one-layer model, 80 steps per mode after 30 of
warm-up). The long one (docs/sanitizers.md):

    TORCHNEURON_SOAK_STEPS=10000 .venv/bin/python -m pytest tests/test_soak.py -q -s

(the demo's configuration, after TORCHNEURON_SOAK_WARMUP warm-up steps: a
tenth of the steps by default).
"""
import gc
import math
import os
import sys

import pytest
import torch

import torchneuron

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import gpt_model as gm  # noqa: E402

STEPS = int(os.environ.get("TORCHNEURON_SOAK_STEPS", "0")) or None  # None: the CI size per mode
# Warm-up steps before the first measurement: the executor's recycled launch
# records take a while to reach their sizes (docs/sanitizers.md).
WARMUP = int(os.environ.get("TORCHNEURON_SOAK_WARMUP", "0")) or (max(30, STEPS // 10) if STEPS else 30)
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


def soak(mode: str, steps: int, warmup: int) -> dict:
    cfg = gm.GPTConfig() if STEPS else gm.GPTConfig(n_layer=1, d_model=64, block_size=32)
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

    torchneuron._C._set_adaptive_eager(mode != "eager")
    try:
        for i in range(warmup):
            step(i).item()
        gc.collect()
        check_allocator_consistent()
        start = {"allocated": torch.neuron.memory_allocated(), "reserved": torch.neuron.memory_reserved(),
                 "rss": rss_bytes()}
        for i in range(warmup, warmup + steps):
            # The loss read every step, as a loop that logs it does: the host
            # runs at most a step ahead (records of queued work grow with the
            # deepest queue seen, a warm-up effect of its own).
            assert math.isfinite(step(i).item())
        gc.collect()
        check_allocator_consistent()
        end = {"allocated": torch.neuron.memory_allocated(), "reserved": torch.neuron.memory_reserved(),
               "rss": rss_bytes()}
    finally:
        torchneuron._C._set_adaptive_eager(True)
    return {"start": start, "end": end}


@pytest.mark.parametrize("mode", ["eager", "fused", "compiled"])
def test_memory_stays_flat(mode):
    steps = STEPS or 80
    r = soak(mode, steps, warmup=WARMUP)
    print(f"\nsoak {mode}, {steps} steps: {r}")
    start, end = r["start"], r["end"]
    for key in ("allocated", "reserved", "rss"):
        assert end[key] <= start[key] * (1 + GROWTH_MAX), (key, start[key], end[key])
