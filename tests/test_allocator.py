"""The caching device allocator: statistics (torch.accelerator's and CUDA's keys),
caching and reuse, out-of-memory, capacity, summaries and snapshots, and
record_stream; the history and snapshot functions with torch.cuda.memory's
signatures and exception types."""
import gc
import inspect
import sys

import pytest
import torch

MiB = 1 << 20


def _clean():
    gc.collect()
    torch.neuron.synchronize()
    torch.neuron.empty_cache()


@pytest.mark.differs_under("memcheck", "blocks carry a redzone, so their byte counts differ")
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
        torch.empty(torch.neuron.get_device_properties(0).total_memory + (1 << 30), dtype=torch.uint8, device="neuron")
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
    big @ big, torch.empty_like(x).fill_(1)  # the first call of a signature runs synchronously: the next queue
    torch.neuron.synchronize()
    with torch.neuron.stream(s):
        big @ big  # keep stream s busy
        x.record_stream(s)
        x.fill_(1)
    del x
    y = torch.empty(MiB, dtype=torch.uint8, device="neuron")
    assert y.data_ptr() != ptr  # still in use on s
    s.synchronize()



def _parameters(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", ["_record_memory_history", "_snapshot"])
def test_history_signatures_are_torch_cuda_s(name):
    assert _parameters(getattr(torch.neuron.memory, name)) == _parameters(getattr(torch.cuda.memory, name))


def _record(*args, **kwargs):
    torch.neuron.memory._record_memory_history(*args, **kwargs)


def _history(device=0):
    return torch.neuron.memory._snapshot()["device_traces"][device]


def test_record_memory_history_argument_errors_are_torch_cuda_s():
    # torch.cuda checks its options in C++ (TORCH_CHECK: RuntimeError) after
    # its pybind conversion (TypeError for a value of the wrong type).
    record = torch.neuron.memory._record_memory_history
    for kwargs in ({"enabled": "always"}, {"context": "stacks"}, {"stacks": "cpp"}):
        with pytest.raises(RuntimeError, match="expected"):
            record(**kwargs)
    for kwargs in ({"enabled": 3}, {"context": 1.0}, {"stacks": None}, {"max_entries": -1}, {"max_entries": "9"}):
        with pytest.raises(TypeError):
            record(**kwargs)
    x = torch.empty(100, device="neuron")
    assert _history() == []  # no rejected call started recording
    del x


def test_record_memory_history_modes():
    try:
        _record(max_entries=3)
        xs = [torch.empty(1000 * (i + 1), device="neuron") for i in range(4)]
        last = xs[-1].untyped_storage().data_ptr()
        events = _history()
        assert len(events) == 3 and events[-1]["action"] == "alloc" and events[-1]["addr"] == last
        _record(skip_actions=["alloc"])  # what is kept from here on: every event but allocations
        del xs
        torch.neuron.synchronize()
        events = _history()
        assert {e["action"] for e in events} >= {"free_requested"} and "alloc" not in {e["action"] for e in events}
        _record("all", clear_history=True)
        assert _history() == []
        x = torch.empty(100, device="neuron")
        events = _history()  # the allocation, after a new segment if one was needed
        assert [e["action"] for e in events] in (["alloc"], ["segment_alloc", "alloc"])
        assert events[-1]["addr"] == x.untyped_storage().data_ptr()
        _record("state")  # CUDA keeps the newest event only
        y = torch.empty(100, device="neuron")
        events = _history()
        assert len(events) == 1 and events[0]["addr"] == y.untyped_storage().data_ptr()
        _record(None)
        assert _history() == []
        _record(True, trace_alloc_max_entries=2, skip_actions=["segment_alloc"])  # the legacy form
        z = [torch.empty(100, device="neuron") for _ in range(3)]
        assert [e["addr"] for e in _history()] == [t.untyped_storage().data_ptr() for t in z[1:]]
        _record(False)
        assert _history() == []
        del x, y, z
    finally:
        _record(None)


@pytest.mark.parametrize("stacks", ["python", "all"])
def test_record_memory_history_keeps_python_frames(stacks):
    try:
        _record(stacks=stacks)
        x = torch.empty(3000, device="neuron"); line = sys._getframe().f_lineno  # noqa: E702
        snapshot = torch.neuron.memory._snapshot()
    finally:
        _record(None)
    (alloc,) = [e for e in snapshot["device_traces"][0]
                if e["action"] == "alloc" and e["addr"] == x.untyped_storage().data_ptr()]
    here = {"filename": __file__, "line": line, "name": "test_record_memory_history_keeps_python_frames"}
    assert any({k: f.get(k) for k in here} == here for f in alloc["frames"]), alloc["frames"]
    if stacks == "all":  # C++ frames too: the allocator's own
        assert any("allocate" in f["name"] for f in alloc["frames"] if f["filename"] != __file__), alloc["frames"]


def _frames_of(snapshot, ptr):
    """The frames of ptr's block, of its alloc event and of its free_requested event."""
    (block,) = [b for s in snapshot["segments"] for b in s["blocks"] if b["address"] == ptr and
                b["state"] == "active_allocated"] or [{"frames": None}]
    events = {e["action"]: e["frames"] for e in snapshot["device_traces"][0] if e["addr"] == ptr}
    return block["frames"], events.get("alloc"), events.get("free_requested")


@pytest.mark.parametrize("context", [None, "state", "alloc", "all"])
def test_record_memory_history_context_decides_which_frames_are_kept(context):
    """As on CUDA: "state" keeps the frames of live blocks, "alloc" of allocation events too, "all" of frees too."""
    _clean()
    try:
        _record(context=context)
        x = torch.empty(3000, device="neuron")
        ptr = x.untyped_storage().data_ptr()
        block, _, _ = _frames_of(torch.neuron.memory._snapshot(), ptr)
        del x
        _, alloc, free = _frames_of(torch.neuron.memory._snapshot(), ptr)
    finally:
        _record(None)
    assert (len(block) > 0, len(alloc) > 0, len(free) > 0) == {
        None: (False, False, False), "state": (True, False, False), "alloc": (True, True, False),
        "all": (True, True, True)}[context]


def test_record_memory_history_legacy_form_keeps_frames():
    try:
        torch.neuron.memory._record_memory_history(True, trace_alloc_max_entries=100, trace_alloc_record_context=True)
        x = torch.empty(3000, device="neuron")
        _, alloc, _ = _frames_of(torch.neuron.memory._snapshot(), x.untyped_storage().data_ptr())
    finally:
        _record(None)
    assert any(f["filename"] == __file__ for f in alloc)


def test_snapshot_honours_its_device():
    _clean()
    try:
        _record()
        x0 = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron:0")
        x1 = torch.empty(5 * MiB, dtype=torch.uint8, device="neuron:1")
        everything = torch.neuron.memory._snapshot()
        assert {s["device"] for s in everything["segments"]} == {0, 1}
        for index, device in ((0, 0), (1, 1), (1, "neuron:1"), (1, torch.device("neuron", 1))):
            snapshot = torch.neuron.memory._snapshot(device)
            assert snapshot["segments"] == [s for s in everything["segments"] if s["device"] == index]
            traces = snapshot["device_traces"]
            assert len(traces) == torch.neuron.device_count()
            assert traces[index] == everything["device_traces"][index] != []
            assert all(t == [] for d, t in enumerate(traces) if d != index)
        with torch.neuron.device(1):
            assert torch.neuron.memory._snapshot("neuron")["segments"] == \
                torch.neuron.memory._snapshot(1)["segments"]
        del x0, x1
    finally:
        _record(None)


def test_snapshot_device_errors():
    # torch.cuda.memory._snapshot passes no device to its binding, so it has no
    # error of its own to copy; the device is checked as torch.neuron's memory
    # functions check it: another device type is a ValueError (torch.cuda's
    # _get_device_index), an invalid index an IndexError (as memory_stats).
    for bad in ("cpu", torch.device("cpu"), "cuda:0"):
        with pytest.raises(ValueError):
            torch.neuron.memory._snapshot(bad)
        with pytest.raises(ValueError):
            torch.neuron.memory_stats(bad)
    for bad in (2, -1, "neuron:7"):
        with pytest.raises(IndexError):
            torch.neuron.memory._snapshot(bad)
        with pytest.raises(IndexError):
            torch.neuron.memory_stats(bad)
