"""torch_neuronx.profiling: TorchNeuron's documented profiling program runs
unchanged and writes its profile directory (framework trace with the device's
tasks, host samples per mode); capture_enabled_for_nc and max_events_per_nc
filter the device's tasks; bad arguments raise; the explorer opens the
result; each rank of a distributed run writes its own directory."""
import copy
import json
import os
import re
import socket
import subprocess
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, record_function
from torch._C._profiler import _ExperimentalConfig

import torch_neuronx
import torchneuron
import torchneuron.explorer as explorer
from neuron_testing import ROOT
from torch_neuronx.profiling import NeuronConfig, NeuronProfiler, ProfileMode

STAMP = re.compile(r"^\d{8}_\d{6}_\d{6}(_\d+)?$")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to("neuron")


def _step(model, x):
    with record_function("step"):
        model(x).sum().backward()


def _sessions(root):
    """{process directory: [session directories]} under a profile_output_dir."""
    out = {}
    for p in sorted(os.listdir(root)):
        out[p] = sorted(os.listdir(os.path.join(root, p)))
    return out


def _only_session(root):
    """The one session directory under a profile_output_dir."""
    (process_dir, (stamp,)), = _sessions(root).items()
    return os.path.join(root, process_dir, stamp)


def _trace(directory):
    with open(os.path.join(directory, "trace.json"), encoding="utf-8") as f:
        return json.load(f)


def _device_ops(trace):
    """The ATen operators the device ran: each task's operator and a fused group's members."""
    names = set()
    for e in trace["traceEvents"]:
        if e.get("cat") == "kernel":
            names.add(e["args"]["operator"])
            names.update(e["args"].get("fused_members", []))
    return names


def _documented_run(model, x, cfg):
    # The program of TorchNeuron's profiling guide, as a user writes it.
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                experimental_config=cfg, on_trace_ready=NeuronProfiler(cfg).export_trace,
                                record_shapes=True, with_stack=True, profile_memory=True) as prof:
        _step(model, x)
        torch_neuronx.synchronize()
    return prof


def test_documented_program_writes_the_guides_layout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, x = _model(), torch.randn(32, 64, device="neuron")
    for _ in range(3):  # warm-up, as the guide asks
        _step(model, x)
    torch_neuronx.synchronize()
    cfg = NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], profile_output_dir="./profile_output")
    _documented_run(model, x, cfg)

    root = tmp_path / "profile_output"
    sessions = _sessions(root)
    process_dir = f"{socket.gethostname()}_pid_{os.getpid()}"
    assert list(sessions) == [process_dir] and len(sessions[process_dir]) == 1
    stamp = sessions[process_dir][0]
    assert STAMP.match(stamp), stamp
    session = root / process_dir / stamp
    # DEVICE and RUNTIME: the framework trace only (no NEFF, NTFF or runtime protobufs here).
    assert sorted(os.listdir(session)) == ["trace.json"]
    trace = _trace(session)
    info = trace["neuronProfile"]
    assert info["rank"] == 0 and info["pid"] == os.getpid() and info["modes"] == ["DEVICE", "RUNTIME"]
    assert info["files"] == ["trace.json"] and set(info["not_produced"]) == {"DEVICE", "RUNTIME"}
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    assert kernels and info["device_tasks_per_nc"] == {"0": len(kernels)} and info["dropped_tasks_per_nc"] == {}
    assert trace["distributedInfo"]["rank"] == 0
    cpu_ops = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "cpu_op"}
    assert {"aten::addmm", "aten::relu", "aten::sum"} <= cpu_ops
    # with_stack, profile_memory: Python frames and the device allocator's records are in it
    assert any(e.get("cat") == "python_function" for e in trace["traceEvents"])
    assert any(e.get("name") == "[memory]" and e["args"]["Device Type"] == 20 for e in trace["traceEvents"])


def test_trace_has_what_a_plain_profiler_run_has(tmp_path):
    model, x = _model(), torch.randn(32, 64, device="neuron")
    for _ in range(3):
        _step(model, x)
    torch_neuronx.synchronize()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                record_shapes=True, with_stack=True, profile_memory=True) as plain:
        _step(model, x)
        torch_neuronx.synchronize()
    plain.export_chrome_trace(str(tmp_path / "plain.json"))
    plain_trace = json.loads((tmp_path / "plain.json").read_text())
    cfg = NeuronConfig(profile_output_dir=str(tmp_path / "out"))
    _documented_run(model, x, cfg)
    trace = _trace(_only_session(tmp_path / "out"))

    def ops(t, cat):
        return sorted(e["name"] for e in t["traceEvents"] if e.get("cat") == cat)

    assert ops(trace, "cpu_op") == ops(plain_trace, "cpu_op")
    # Adaptive eager may group element-wise tasks differently from run to run; the operators run are the same.
    assert _device_ops(trace) == _device_ops(plain_trace) and {"aten::addmm", "aten::mm"} <= _device_ops(trace)
    assert len(ops(trace, "privateuse1_runtime")) == len(ops(trace, "kernel")) > 0


def test_schedule_with_repeat_writes_one_directory_per_cycle(tmp_path):
    model, x = _model(), torch.randn(32, 64, device="neuron")
    cfg = NeuronConfig(profile_output_dir=str(tmp_path))
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                experimental_config=cfg, on_trace_ready=NeuronProfiler(cfg).export_trace,
                                schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2)) as prof:
        for _ in range(8):
            _step(model, x)
            torch_neuronx.synchronize()
            prof.step()
    (process_dir, stamps), = _sessions(tmp_path).items()
    assert len(stamps) == 2 and stamps == sorted(stamps)
    for stamp, steps in zip(stamps, [(2, 3), (6, 7)]):
        trace = _trace(tmp_path / process_dir / stamp)
        names = {e["name"] for e in trace["traceEvents"]}
        assert {f"ProfilerStep#{s}" for s in steps} <= names
        assert not {f"ProfilerStep#{s}" for s in range(8) if s not in steps} & names
        # each active step runs the forward's two addmm on the device
        assert sum(e.get("cat") == "kernel" and e["args"]["operator"] == "aten::addmm"
                   for e in trace["traceEvents"]) == 2 * len(steps)


def test_cpu_util_and_host_memory_are_sampled(tmp_path):
    a = torch.randn(512, 512, device="neuron")
    cfg = NeuronConfig(modes=[ProfileMode.CPU_UTIL, ProfileMode.HOST_MEMORY], profile_output_dir=str(tmp_path))
    import time
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                experimental_config=cfg, on_trace_ready=NeuronProfiler(cfg).export_trace):
        end = time.monotonic() + 0.4  # several sampling periods
        while time.monotonic() < end:
            a @ a
            torch_neuronx.synchronize()
    session = _only_session(tmp_path)
    assert sorted(os.listdir(session)) == ["cpu_util.json", "host_mem.json", "trace.json"]
    cpu = json.load(open(os.path.join(session, "cpu_util.json")))
    mem = json.load(open(os.path.join(session, "host_mem.json")))
    assert cpu["cpus"] == os.cpu_count() and len(cpu["samples"]) >= 2
    for s in cpu["samples"]:
        assert 0 <= s["host_busy"] <= 1 and len(s["per_cpu_busy"]) == os.cpu_count() and s["process_cpus"] >= 0
    # the matmul loop keeps this process busy
    assert max(s["process_cpus"] for s in cpu["samples"]) > 0.2
    assert len(mem["samples"]) >= 2
    for s in mem["samples"]:
        assert 0 < s["used_bytes"] <= s["total_bytes"] and 0 < s["process_rss_bytes"] <= s["total_bytes"]
    trace = _trace(session)
    counters = [e for e in trace["traceEvents"] if e.get("ph") == "C"]
    assert {e["name"] for e in counters} == {"host CPU utilisation (%)", "process CPU (%)", "host memory (bytes)"}
    # on the trace's clock: inside (or at the edges of) the span of the device's tasks
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    first, last = min(e["ts"] for e in kernels), max(e["ts"] + e["dur"] for e in kernels)
    assert all(first - 100e3 <= e["ts"] <= last + 100e3 for e in counters)
    assert trace["neuronProfile"]["not_produced"] == {}
    summary = explorer.analyze(session)["summary"]
    assert summary["host_samples"]["cpu"]["samples"] == len(cpu["samples"])
    assert summary["host_samples"]["memory"]["peak_used"] == max(s["used_bytes"] for s in mem["samples"])


def test_capture_enabled_for_nc_and_max_events_per_nc_filter_device_tasks(tmp_path):
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two NeuronCores")
    a0, a1 = torch.randn(256, 256, device="neuron:0"), torch.randn(256, 256, device="neuron:1")
    a0 @ a0, a1 @ a1  # a first call checks itself on the host (test_errors.py): not part of what is counted
    torch_neuronx.synchronize()
    cfg = NeuronConfig(profile_output_dir=str(tmp_path), capture_enabled_for_nc="1", max_events_per_nc=3)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                experimental_config=cfg, on_trace_ready=NeuronProfiler(cfg).export_trace):
        for _ in range(5):
            a0 @ a0
        torch_neuronx.synchronize(0)
        for _ in range(5):
            a1 @ a1
        torch_neuronx.synchronize(1)
    trace = _trace(_only_session(tmp_path))
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    assert [e["args"]["device"] for e in kernels] == [1, 1, 1]
    # the newest three: launched by the last three of the ten matmuls
    mm_ops = sorted((e for e in trace["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] == "aten::mm"),
                    key=lambda e: e["ts"])
    assert len(mm_ops) == 10
    assert {e["args"]["External id"] for e in kernels} == {e["args"]["External id"] for e in mm_ops[-3:]}
    info = trace["neuronProfile"]
    assert info["device_tasks_per_nc"] == {"1": 3} and info["dropped_tasks_per_nc"] == {"1": 2}
    assert info["tasks_of_other_ncs"] == 5 and info["capture_enabled_for_nc"] == "1"


def test_a_raw_config_string_reaches_the_device_profiler():
    # TorchNeuron's profiler reads the same string from a plain _ExperimentalConfig.
    a = torch.randn(64, 64, device="neuron")
    raw = _ExperimentalConfig(custom_profiler_config="max_events_per_nc:2;capture_enabled_for_nc:0-0;cpu_util:maybe")
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                experimental_config=raw) as prof:
        for _ in range(4):
            a @ a
        torch_neuronx.synchronize()
    tasks = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    assert len(tasks) == 2
    report = torchneuron._C._profiler_last_session()
    assert report["kept"] == {0: 2} and report["dropped"] == {0: 2}
    assert report["problems"] == ["cpu_util: cannot read 'maybe'"] and not report["cpu_util"]


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(modes=ProfileMode.DEVICE), TypeError, "modes"),
    (dict(modes=["DEVICE"]), TypeError, "modes"),
    (dict(max_events_per_nc=0), ValueError, "max_events_per_nc"),
    (dict(max_events_per_nc=1.5), TypeError, "max_events_per_nc"),
    (dict(max_events_per_nc=True), TypeError, "max_events_per_nc"),
    (dict(capture_enabled_for_nc=[0, 1]), TypeError, "capture_enabled_for_nc"),
    (dict(capture_enabled_for_nc="0,x"), ValueError, "capture_enabled_for_nc"),
    (dict(capture_enabled_for_nc="5-2"), ValueError, "runs backwards"),
    (dict(profile_output_dir=None), TypeError, "profile_output_dir"),
    (dict(profile_output_dir=""), ValueError, "profile_output_dir"),
    (dict(profile_output_dir="a;b"), ValueError, "profile_output_dir"),
    (dict(neff_cache_dir=3), TypeError, "neff_cache_dir"),
    (dict(precache_node_info="yes"), TypeError, "precache_node_info"),
])
def test_bad_arguments_raise(kwargs, error, words):
    with pytest.raises(error, match=words):
        NeuronConfig(**kwargs)


def test_bad_profiler_arguments_raise(tmp_path):
    with pytest.raises(TypeError, match="NeuronConfig"):
        NeuronProfiler(_ExperimentalConfig())
    with pytest.raises(TypeError, match="torch.profiler.profile"):
        NeuronProfiler(NeuronConfig(profile_output_dir=str(tmp_path))).export_trace("trace.json")


def test_config_is_an_experimental_config_with_the_documented_defaults(tmp_path):
    cfg = NeuronConfig()
    assert isinstance(cfg, _ExperimentalConfig)
    assert cfg.modes == [ProfileMode.DEVICE, ProfileMode.RUNTIME] and cfg.max_events_per_nc == 1_000_000
    assert cfg.capture_enabled_for_nc is None and cfg.neff_cache_dir is None and cfg.precache_node_info is True
    cfg = NeuronConfig(modes=[ProfileMode.HOST_MEMORY], max_events_per_nc=100000, capture_enabled_for_nc="0, 1,2-5",
                       profile_output_dir=str(tmp_path))
    assert cfg.custom_profiler_config == (f"profile_output_dir:{tmp_path};max_events_per_nc:100000;"
                                          "capture_enabled_for_nc:0,1,2-5;cpu_util:false;host_memory:true;"
                                          "modes:host_memory")
    # torch.profiler copies the config when trace_only meets with_stack: the copy is a NeuronConfig too
    cfg.trace_only = True
    other = copy.copy(cfg)
    assert type(other) is NeuronConfig and other.custom_profiler_config == cfg.custom_profiler_config
    assert other.trace_only and other.modes == [ProfileMode.HOST_MEMORY]
    assert torch_neuronx.NeuronProfiler is NeuronProfiler and "NeuronProfiler" in torch_neuronx.__all__
    assert torch_neuronx.profiling.ProfileMode is ProfileMode


def test_export_of_a_profile_run_without_the_config_says_so(tmp_path):
    cfg = NeuronConfig(profile_output_dir=str(tmp_path))
    a = torch.randn(64, 64, device="neuron")
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                on_trace_ready=NeuronProfiler(cfg).export_trace):
        a @ a
        torch_neuronx.synchronize()
    info = _trace(_only_session(tmp_path))["neuronProfile"]
    assert "experimental_config" in info["device_activity"] and "device_tasks_per_nc" not in info


def test_explorer_opens_the_output_directory(tmp_path, capsys):
    model, x = _model(), torch.randn(32, 64, device="neuron")
    cfg = NeuronConfig(profile_output_dir=str(tmp_path / "profile_output"))
    exporter = NeuronProfiler(cfg)
    session = None
    for _ in range(2):  # two profiles: two session directories
        with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                    experimental_config=cfg) as prof:
            _step(model, x)
            torch_neuronx.synchronize()
        session = exporter.export_trace(prof)
    # one session's directory, its process directory's parent holding two: by API and command line
    out = explorer.report(session, str(tmp_path / "report.html"))
    html = open(out, encoding="utf-8").read()
    data = json.loads(re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>',
                                html, re.S).group(1))
    assert data["summary"]["has_device_rows"] and data["summary"]["neuron_profile"]["modes"] == ["DEVICE", "RUNTIME"]
    assert {"aten::addmm", "aten::relu"} <= {r["name"] for r in data["operators"]}
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "torchneuron.explorer", *args], capture_output=True,
                              text=True, env=env, cwd=ROOT, timeout=120)

    r = cli(session, "-o", str(tmp_path / "cli.html"))
    assert r.returncode == 0 and r.stdout.strip() == str(tmp_path / "cli.html"), r.stderr
    # A directory with several traces, or none: the command line says so (in-process: no second start-up).
    from torchneuron.explorer.__main__ import main
    assert main([str(tmp_path / "profile_output"), "-o", str(tmp_path / "two.html")]) == 2
    err = capsys.readouterr().err
    assert "holds 2 traces" in err and session in err and not (tmp_path / "two.html").exists()
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2 and "no profiler trace" in capsys.readouterr().err


def _profiled_rank(rank, world, port, root):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.neuron.set_device(rank)
    dist.init_process_group("neuron", rank=rank, world_size=world)
    try:
        cfg = NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], profile_output_dir=root,
                           capture_enabled_for_nc=str(rank))
        t = torch.full((1024,), float(rank + 1), device="neuron")
        with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                                    experimental_config=cfg, on_trace_ready=NeuronProfiler(cfg).export_trace):
            (t * 2).sum()
            dist.all_reduce(t)
            torch_neuronx.synchronize()
        return {"pid": os.getpid(), "sum": t[0].item()}
    finally:
        dist.destroy_process_group()


def test_each_rank_writes_its_own_directory(tmp_path):
    from distributed_testing import spawn_ranks

    ranks = spawn_ranks(_profiled_rank, 2, str(tmp_path), timeout=120)
    sessions = _sessions(tmp_path)
    host = socket.gethostname()
    assert sorted(sessions) == sorted(f"{host}_pid_{r['pid']}" for r in ranks.values())
    for rank, r in ranks.items():
        assert r["sum"] == 3.0
        (stamp,) = sessions[f"{host}_pid_{r['pid']}"]
        trace = _trace(tmp_path / f"{host}_pid_{r['pid']}" / stamp)
        assert trace["neuronProfile"]["rank"] == rank and trace["distributedInfo"]["rank"] == rank
        assert trace["distributedInfo"]["world_size"] == 2
        devices = {e["args"]["device"] for e in trace["traceEvents"] if e.get("cat") == "kernel"}
        assert devices == {rank}
