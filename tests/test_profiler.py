"""torch.profiler on `neuron`: every device task is a device activity on its
NeuronCore and stream, linked to the operator that launched it, with flows,
fused members and device time in key_averages(); profile_memory sees the
device allocator; the legacy `use_device` path times operators; sessions
without device activities record none."""
import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

import torchneuron
from neuron_testing import run_python

N = 1 << 20  # elements: large enough to fuse (docs/adaptive_eager.md)


# The stream sanitizer's dispatch mode calls each operator again inside the profiled call, so the
# profiler records each operator (and its memory) twice.
RECORDED_TWICE = "the profiler records each operator twice, the second time inside the sanitizer's dispatch mode"


def _known_program(a, b, x, side):
    """Launches exactly: one mm, one fused group of three element-wise ops,
    and a group of one add on a side stream."""
    with record_function("known_program"):
        c = a @ b
        y = (x * 2 + 1).relu()
        with torch.neuron.stream(side):
            z = x + 3
    return c, y, z


@pytest.fixture
def inputs():
    # An mm long enough that the element-wise ops issued behind it join one
    # pending group even on a loaded machine (the fuser merges into the newest
    # task while it has not started).
    a, b = torch.randn(1536, 1536, device="neuron"), torch.randn(1536, 1536, device="neuron")
    x = torch.randn(N, device="neuron")
    side = torch.neuron.Stream()
    torch.neuron.current_stream().wait_stream(side)
    side.wait_stream(torch.neuron.current_stream())
    _known_program(a, b, x, side)  # first calls run synchronously (test_errors.py); later ones queue
    torch.accelerator.synchronize()
    yield a, b, x, side
    torch.accelerator.synchronize()  # the side stream read x: its work ends before x is freed


def _device_events(prof):
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]


def test_every_task_appears_once_linked_to_its_operator(inputs, tmp_path):
    a, b, x, side = inputs
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NEURON]) as prof:
        _known_program(a, b, x, side)
    names = sorted(e.name for e in _device_events(prof))
    assert names == sorted(["aten::mm", "fused:aten::mul.Tensor+aten::add.Tensor+aten::relu", "fused:aten::add.Tensor"])
    # each device task hangs under the CPU operator that launched it
    launched = {k.name: e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU
                for k in e.kernels}
    assert launched["aten::mm"] == "aten::mm"
    assert launched["fused:aten::add.Tensor"] == "aten::add"
    assert launched["fused:aten::mul.Tensor+aten::add.Tensor+aten::relu"] == "aten::mul"

    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())["traceEvents"]
    tasks = [e for e in trace if e.get("cat") == "kernel"]
    assert len(tasks) == 3
    by_name = {e["name"]: e for e in tasks}
    ops = {e["args"]["External id"]: e for e in trace if e.get("cat") == "cpu_op"}
    side_id = side.stream_id
    for name, stream, op, kind in [("aten::mm", 0, "aten::mm", "op"), ("fused:aten::add.Tensor", side_id, "aten::add", "fused")]:
        t = by_name[name]
        assert (t["pid"], t["tid"]) == (0, stream)
        assert (t["args"]["device"], t["args"]["stream"]) == (0, stream)
        assert ops[t["args"]["External id"]]["name"] == op
        assert t["args"]["kind"] == kind and t["args"]["operator"] == name.removeprefix("fused:")
    fused = by_name["fused:aten::mul.Tensor+aten::add.Tensor+aten::relu"]
    assert fused["args"]["kind"] == "fused" and fused["args"]["operator"] == "aten::mul.Tensor"
    assert fused["args"]["fused_members"] == ["aten::mul.Tensor", "aten::add.Tensor", "aten::relu"]
    # a launch on the host thread, and a flow from it to each task
    launches = [e for e in trace if e.get("cat") == "privateuse1_runtime"]
    assert len(launches) == 3
    flows = [e for e in trace if e.get("cat") == "ac2g"]
    correlations = {t["args"]["correlation"] for t in tasks}
    assert {f["id"] for f in flows if f["ph"] == "s"} == correlations
    assert {f["id"] for f in flows if f["ph"] == "f"} == correlations
    assert all(t["dur"] >= 0 and "queued_us" in t["args"] for t in tasks)


@pytest.mark.differs_under("stream_sanitizer", RECORDED_TWICE)
def test_device_time_in_key_averages_agrees_with_the_runtime(inputs):
    a, b, _, _ = inputs
    events = [(torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)) for _ in range(20)]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NEURON]) as prof:
        for start, end in events:
            start.record()
            a @ b
            end.record()
    mm = next(e for e in prof.key_averages() if e.key == "aten::mm")
    assert mm.count == 20
    tasks = [e.time_range.elapsed_us() for e in _device_events(prof) if e.name == "aten::mm"]
    assert mm.self_device_time_total == pytest.approx(sum(tasks), rel=1e-6)
    # Each task against the events around it (markers taken on the device just
    # before and after): the same time, less the markers' own run.
    ratios = sorted(t / (start.elapsed_time(end) * 1e3) for t, (start, end) in zip(tasks, events))
    assert 0.9 <= ratios[len(ratios) // 2] <= 1.0


def test_two_sessions_in_one_process_and_a_cpu_only_session(inputs):
    a, b, x, side = inputs
    for _ in range(2):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NEURON]) as prof:
            _known_program(a, b, x, side)
        assert len(_device_events(prof)) == 3
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _known_program(a, b, x, side)
    assert _device_events(prof) == []
    assert any(e.name == "aten::mm" for e in prof.events())


@pytest.mark.differs_under("memcheck", "blocks carry a redzone, so the profiled byte counts differ")
@pytest.mark.differs_under("stream_sanitizer", RECORDED_TWICE)
def test_profile_memory_reports_device_allocations(inputs, tmp_path):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NEURON], profile_memory=True) as prof:
        t = torch.empty(1 << 20, device="neuron")
        del t
    mm = [e for e in prof.key_averages() if e.key == "aten::empty"]
    assert mm and mm[0].device_memory_usage == 4 << 20
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    records = [e["args"] for e in json.loads(path.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    neuron = [r for r in records if r["Device Type"] == int(torch.autograd.DeviceType.PrivateUse1.value)]
    assert [r["Bytes"] for r in neuron] == [4 << 20, -(4 << 20)]
    assert neuron[0]["Total Allocated"] - neuron[1]["Total Allocated"] == 4 << 20


def test_schedule_and_tensorboard_handler(inputs, tmp_path):
    a, b, x, side = inputs
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NEURON],
                 schedule=torch.profiler.schedule(wait=1, warmup=1, active=2),
                 on_trace_ready=torch.profiler.tensorboard_trace_handler(str(tmp_path))) as prof:
        for _ in range(4):
            _known_program(a, b, x, side)
            prof.step()
    files = list(tmp_path.glob("*.pt.trace.json"))
    assert len(files) == 1
    trace = json.loads(files[0].read_text())["traceEvents"]
    # Tasks launched in the two active steps; the side stream's adds, idle
    # behind no other work, join one group across steps (launched in the first).
    assert sum(e.get("cat") == "kernel" and e["name"] == "aten::mm" for e in trace) == 2


def test_legacy_use_device_path_times_operators_without_asserts():
    r = run_python("""
        import torch, torchneuron
        a = torch.randn(512, 512, device="neuron")
        a @ a
        torch.neuron.synchronize()
        with torch.autograd.profiler.profile(use_device="neuron") as prof:
            for _ in range(3):
                a @ a
        mm = next(e for e in prof.key_averages() if e.key == "aten::mm")
        print("device_us", mm.device_time_total, "cpu_us", mm.cpu_time_total)
        print(prof.key_averages().table(row_limit=5))
    """)
    assert r.returncode == 0, r.stderr
    assert "INTERNAL ASSERT" not in r.stderr and "nan" not in r.stdout.lower(), r.stdout + r.stderr
    device_us = float(r.stdout.split("device_us ")[1].split()[0])
    assert device_us > 0
    assert "-" not in r.stdout.split("device_us ")[1].split()[0]


def test_idle_profiler_records_no_launchers():
    # Outside a session the runtime takes no launcher data (no observer).
    assert torchneuron._C._task_observer_set() is False
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NEURON]):
        assert torchneuron._C._task_observer_set() is True
    assert torchneuron._C._task_observer_set() is False
