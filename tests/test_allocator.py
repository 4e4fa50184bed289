"""The caching device allocator: statistics (torch.accelerator's and CUDA's keys),
caching and reuse, out-of-memory, capacity, summaries and snapshots, and
record_stream."""
import gc

import pytest
import torch

MiB = 1 << 20


def _clean():
    gc.collect()
    torch.neuron.synchronize()
    torch.neuron.empty_cache()


def test_allocated_reserved_and_peak():
    _clean()
    base = torch.neuron.memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    x = torch.empty(4 * MiB, dtype=torch.uint8, device="neuron")
    assert torch.neuron.memory_allocated() == base + 4 * MiB
    assert torch.neuron.memory_reserved() >= torch.neuron.memory_allocated()
    del x
    torch.neuron.synchronize()
    assert torch.neuron.memory_allocated() == base
    assert torch.neuron.max_memory_allocated() >= base + 4 * MiB
    reserved = torch.neuron.memory_reserved()
    assert reserved >= 4 * MiB  # freed blocks stay cached
    y = torch.empty(4 * MiB, dtype=torch.uint8, device="neuron")
    assert torch.neuron.memory_reserved() == reserved  # ... and are reused
    del y
    _clean()
    assert torch.neuron.memory_reserved() < reserved


def test_stats_match_torch_accelerator_and_cuda_keys():
    x = torch.ones(1000, device="neuron")
    stats = torch.neuron.memory_stats()
    assert stats == torch.accelerator.memory_stats(0)
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
                "active_bytes.all.current", "requested_bytes.all.current", "segment.all.current",
                "allocation.all.current", "num_ooms"):
        assert key in stats, key
    assert stats["reserved_bytes.all.current"] >= stats["allocated_bytes.all.current"] >= 4000
    assert stats["requested_bytes.all.current"] <= stats["allocated_bytes.all.current"]
    del x


def test_out_of_memory_is_an_exception_and_leaves_no_trace():
    _clean()
    keep = torch.ones(MiB, device="neuron")
    before = {k: v for k, v in torch.neuron.memory_stats().items() if k.endswith(".current")}
    with pytest.raises(torch.OutOfMemoryError, match="neuron:0 out of memory"):
        torch.empty(5 << 30, dtype=torch.uint8, device="neuron")
    after = {k: v for k, v in torch.neuron.memory_stats().items() if k.endswith(".current")}
    assert after == before
    assert torch.neuron.memory_stats()["num_ooms"] >= 1
    z = torch.zeros(64 * MiB, dtype=torch.uint8, device="neuron")  # still works
    assert z.sum().item() == 0
    assert keep.sum().item() == MiB


def test_capacity_is_configurable():
    from neuron_testing import run_python

    r = run_python(
        """
        import torch
        print(torch.neuron.get_device_properties(0).total_memory)
        try:
            torch.empty(300 << 20, dtype=torch.uint8, device="neuron")
        except torch.OutOfMemoryError as e:
            print("oom")
        """,
        env={"TORCHNEURON_HBM_BYTES": "256M"},
    )
    assert r.stdout.split() == [str(256 << 20), "oom"], r.stderr


def test_memory_summary_and_snapshot():
    x = torch.ones(3 * MiB, device="neuron")
    summary = torch.neuron.memory_summary()
    assert "Allocated memory" in summary and "neuron:0" in summary
    torch.neuron.memory._record_memory_history()
    y = torch.ones(10, device="neuron")
    snap = torch.neuron.memory._snapshot()
    torch.neuron.memory._record_memory_history(None)
    assert any(b["state"] == "active_allocated" for s in snap["segments"] for b in s["blocks"])
    seg = snap["segments"][0]
    assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
    assert any(e["action"] == "alloc" for e in snap["device_traces"][0])
    from torch.cuda import _memory_viz  # PyTorch's own reader of the format

    assert "total_reserved" in _memory_viz.segsum(snap)
    del x, y


def test_record_stream_defers_reuse():
    _clean()
    s = torch.neuron.Stream()
    x = torch.empty(MiB, dtype=torch.uint8, device="neuron")
    ptr = x.data_ptr()
    big = torch.randn(1024, 1024, device="neuron")
    with torch.neuron.stream(s):
        big @ big  # keep stream s busy
        x.record_stream(s)
        x.fill_(1)
    del x
    y = torch.empty(MiB, dtype=torch.uint8, device="neuron")
    assert y.data_ptr() != ptr  # still in use on s
    s.synchronize()

