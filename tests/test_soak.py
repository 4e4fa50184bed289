"""Soak test: many training steps of the demo model (examples/gpt_model.py),
eager, fused (adaptive eager) and compiled, keep the device allocator's
memory_allocated and memory_reserved and the process's resident set flat
after warm-up (at most 1% growth), with every allocator statistic consistent
(the measurement: benchmarks/soak.py).

CI runs a short version (a one-layer model, 80 steps per mode after 30 of
warm-up). The long one, on the demo's configuration, is the benchmark
(docs/sanitizers.md): ``TORCHNEURON_SOAK_STEPS=10000 .venv/bin/python -m benchmarks.soak``.
"""
import pytest

from benchmarks.soak import GROWTH_MAX, gm, soak


@pytest.mark.parametrize("mode", ["eager", "fused", "compiled"])
def test_memory_stays_flat(mode):
    r = soak(mode, 80, warmup=30, cfg=gm.GPTConfig(n_layer=1, d_model=64, block_size=32))
    start, end = r["start"], r["end"]
    for key in ("allocated", "reserved", "rss"):
        assert end[key] <= start[key] * (1 + GROWTH_MAX), (key, start[key], end[key])
