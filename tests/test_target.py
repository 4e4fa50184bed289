"""The Trainium twin (torchneuron/target, docs/target.md): each rule catches a program
that behaves otherwise on the target and stays silent on one that does not; the
modelled time follows the roofline's figures; the cost report's arithmetic; the
twin is off by default and TORCHNEURON_TARGET turns it on at start-up."""
import dataclasses
import json
import warnings

import pytest
import time

import torch

import torchneuron.target as target
from neuron_testing import run_python
from torchneuron.compile import NeuronCompileError
from torchneuron.nki.machine import MACHINES
from torchneuron.target import TargetWarning, figures, report
from torchneuron.target.roofline import op_cost

DEV = "neuron"


@pytest.fixture
def twin():
    t = target.enable("trn2", lnc=2)
    yield t
    target.disable()


@pytest.fixture
def narrowing():
    t = target.enable("trn2", lnc=2, wide="narrow")
    yield t
    target.disable()


def target_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
        target.summary()  # reads the pending 64-bit checks
    return [str(w.message) for w in caught if issubclass(w.category, TargetWarning)]


# ---------------------------------------------------------------- 64-bit types
def test_an_int64_value_beyond_int32_is_named_with_its_operator_and_line(twin):
    def program():
        ids = torch.arange(4, device=DEV)
        return ids * (1 << 31)  # the line the warning names

    found = target_warnings(program)
    assert len(found) == 1, found
    assert "aten::mul" in found[0] and "test_target.py:" in found[0] and "2147483648" in found[0], found[0]
    assert "int32 as -2147483648" in found[0], found[0]


def test_int64_values_within_int32_and_exact_float64_pass_silently(twin):
    def program():
        ids = torch.arange(1000, device=DEV) * 1000
        halves = torch.arange(8, device=DEV, dtype=torch.float64) / 2
        return ids.sum(), halves.sum()

    assert target_warnings(program) == []


def test_a_float64_value_float32_cannot_hold_is_named(twin):
    found = target_warnings(lambda: torch.full((3,), 0.1, dtype=torch.float64, device=DEV) * 3)
    assert found and "float64" in found[0] and "float32" in found[0], found


def test_a_finding_is_reported_once_per_operator_and_line(twin):
    def program():
        for _ in range(5):
            torch.arange(3, device=DEV) + (1 << 40)

    assert len(target_warnings(program)) == 1


def test_narrow_mode_computes_int64_as_the_targets_int32(narrowing):
    big = torch.tensor([2**31 - 1, -2**31, 5], dtype=torch.int64)
    got = (big.to(DEV) + 1).cpu()
    want = (big.to(torch.int32) + 1).to(torch.int64)  # int32 arithmetic wraps
    assert got.dtype == torch.int64  # as TorchNeuron's tensors, the dtype stays
    assert torch.equal(got, want), (got, want)


def test_narrow_mode_computes_float64_as_float32(narrowing):
    g = torch.Generator().manual_seed(3)
    x, y = (torch.randn(64, generator=g).to(torch.float64) for _ in range(2))
    got = (x.to(DEV) * y.to(DEV) + x.to(DEV)).cpu()
    want = (x.float() * y.float() + x.float()).to(torch.float64)
    assert torch.equal(got, want)
    assert not torch.equal((x * y + x), want)  # the CPU's float64 differs: the rule did something


# ---------------------------------------------------------------- compiles and shape churn
def test_shape_churn_at_one_line_is_reported_once_with_the_changing_dimension(twin):
    def program():
        for n in range(5, 12):
            torch.ones(n, 4, device=DEV).sum(0)  # a growing dimension: a compile per size on the target

    found = [m for m in target_warnings(program) if "shape churn" in m]
    assert any("aten::sum" in m and "dimension 0 of tensor argument 0 takes 5, 6, 7, 8" in m for m in found), found
    assert all("test_target.py:" in m for m in found), found
    assert len([m for m in found if "aten::sum" in m]) == 1


def test_a_repeating_shape_is_one_compile_and_no_churn(twin):
    before = target.summary()["eager_compiles"]

    def program():
        for _ in range(6):
            torch.ones(7, 4, device=DEV).sum(0)

    assert not [m for m in target_warnings(program) if "shape churn" in m]
    assert target.summary()["eager_compiles"] - before == 2  # ones and sum, once each


def test_dynamic_true_is_refused_as_on_the_target_and_accepted_without_the_twin():
    fn = torch.compile(lambda a: a * 2 + 1, backend="neuron", dynamic=True)
    x = torch.randn(5, device=DEV)
    torch.testing.assert_close(fn(x), x * 2 + 1)  # off: the device takes dynamic=True
    torch._dynamo.reset()
    target.enable("trn2")
    try:
        fn = torch.compile(lambda a: a * 2 + 1, backend="neuron", dynamic=True)
        with pytest.raises(Exception) as e:
            fn(x)
        assert isinstance(e.value, NeuronCompileError) or "dynamic=True is not supported on trn2" in str(e.value)
    finally:
        target.disable()
        torch._dynamo.reset()


def test_a_mode_other_than_default_warns_and_each_shape_compiles_its_graph(twin):
    torch._dynamo.reset()
    try:
        fn = torch.compile(lambda a: (a.sin() * 2).sum(), backend="neuron", mode="max-autotune-no-cudagraphs")
        with pytest.warns(TargetWarning, match="supports only the default mode"):
            fn(torch.randn(8, device=DEV))
        before = target.summary()
        for n in (8, 9, 10, 8):
            x = torch.full((n,), 0.5)
            torch.testing.assert_close(fn(x.to(DEV)).cpu(), (x.sin() * 2).sum())
        after = target.summary()
        assert after["graph_compiles"] - before["graph_compiles"] == 2  # 9 and 10: new shapes, not dynamic
        graphs = [o for o in after["top_ops"] if o["op"].startswith("compiled graph")]
        assert sum(o["count"] for o in graphs) == 5  # one launch per call, its operators not charged apart
        assert not any(o["op"] == "aten::sin" for o in after["top_ops"])
    finally:
        torch._dynamo.reset()


# ---------------------------------------------------------------- memory of one logical core
def test_an_allocation_beyond_the_targets_hbm_raises_out_of_memory_naming_it(twin):
    small = dataclasses.replace(MACHINES["trn2"], hbm_bytes_per_device=8 * (4 << 20))  # 8 MiB per logical core
    twin.core = figures.LogicalCore(small, 2)
    torch.empty(4 << 20, dtype=torch.uint8, device=DEV).fill_(1)  # fits
    with pytest.raises(torch.OutOfMemoryError, match="8 MiB of HBM|0 GiB of HBM"):
        torch.empty(16 << 20, dtype=torch.uint8, device=DEV).fill_(1)


# ---------------------------------------------------------------- the roofline
def test_the_roofline_of_a_matmul_an_add_and_a_tiny_op():
    core = figures.logical_core("trn2", 2)
    a, a2 = (torch.randn(2048, 2048, dtype=torch.bfloat16) for _ in range(2))
    mm = op_cost(torch.ops.aten.mm.default, (a, a2), {}, a @ a2, core)
    assert mm.flops == 2 * 2048**3
    assert mm.engine_s["tensor"] == pytest.approx(mm.flops / (79e12 * 2))
    assert mm.engine_s["hbm"] == pytest.approx(3 * a.nbytes / (3.0e12 / 8 * 2))
    assert mm.bound == "compute" and mm.engine == "tensor"
    b = torch.randn(1 << 24)
    add = op_cost(torch.ops.aten.add.Tensor, (b, b), {}, b + b, core)
    assert add.bound == "memory" and add.bytes == 2 * b.nbytes  # the same input read once
    tiny = op_cost(torch.ops.aten.add.Tensor, (b[:4], b[:4]), {}, b[:4] + b[:4], core)
    assert tiny.bound == "launch" and tiny.seconds == pytest.approx(tiny.busy_s + figures.LAUNCH_US["trn2"] * 1e-6)
    assert op_cost(torch.ops.aten.view.default, (b, [-1]), {}, b.view(-1), core) is None
    wide = torch.zeros(1 << 20, dtype=torch.int64)
    assert op_cost(torch.ops.aten.neg.default, (wide,), {}, -wide, core).bytes == 2 * 4 * (1 << 20)


def test_a_training_step_is_charged_and_measured(twin):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8)).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 64, device=DEV)
    with target.measure(steps=3) as w:
        for _ in range(3):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    s = w.summary
    assert s["modelled"] and s["target"] == "trn2" and s["steps"] == 3
    assert s["device_s_per_step"] == pytest.approx(s["device_s"] / 3)
    assert s["device_s"] == pytest.approx(sum(s["bound_s"].values()))
    ops = {o["op"] for o in s["top_ops"]}
    assert "aten::addmm" in ops or "aten::mm" in ops
    assert s["launches"] >= 3 * 10


def _host_work(seconds: float) -> None:
    """Python work on this thread: ``seconds`` of its CPU time (not wall time, which a
    loaded machine stretches)."""
    t = time.thread_time()
    while time.thread_time() - t < seconds:
        pass


def _big_matmuls(read_each: bool, host_s: float) -> dict:
    x = torch.randn(2048, 2048, device=DEV)
    torch.neuron.synchronize()
    with target.measure() as w:
        for _ in range(4):
            y = x @ x
            if read_each:
                y[0, 0].item()
            _host_work(host_s)
    return w.summary


def test_host_work_overlaps_queued_device_work_and_stalls_it_after_a_read(twin):
    # A 2048^3 fp32 matmul is about 0.2 ms on one trn2 logical core: 2 ms of Python work
    # between queued matmuls leaves the device waiting about 2 ms each time; reading a
    # value makes the host wait for the device first, so the wait is the whole 2 ms.
    host = 2e-3
    queued, read = _big_matmuls(False, host), _big_matmuls(True, host)
    for s in (queued, read):
        assert s["host_s"] >= 4 * host * 0.9  # the Python work, measured
        assert s["device_s"] == pytest.approx(sum(s["bound_s"].values()))
    # The first matmul starts at once; each later one waits for the host's work after the previous.
    assert read["bound_s"]["host"] == pytest.approx(3 * host, rel=0.5)
    assert read["device_s"] > 3 * host
    # Without Python work in between, the device never waits for the host by more than the
    # loop's own cost.
    busy = _big_matmuls(False, 0.0)
    assert busy["bound_s"].get("host", 0.0) < 0.25 * busy["device_s"]
    assert busy["host_s"] < 1e-3


def test_the_twins_own_time_is_not_the_hosts(twin):
    # Many tiny operators back to back: the host's work per operator is PyTorch's dispatch,
    # not the twin's bookkeeping nor the emulator's work (both happen inside the mode).
    x = torch.randn(8, device=DEV)
    for _ in range(50):
        x = x * 0.999 + 1  # warm the signatures
    torch.neuron.synchronize()
    t = time.thread_time()
    with target.measure() as w:
        for _ in range(500):
            x = x * 0.999 + 1
    elapsed = time.thread_time() - t
    s = w.summary
    assert s["launches"] + s["fused_ops"] == 1000
    assert 0 < s["host_s"] < 0.5 * elapsed


def _in_thread(fn):
    import threading

    out = {}

    def run():
        try:
            out["value"] = fn()
        except Exception as e:  # noqa: BLE001  (raised again on the caller's thread)
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_device_work_of_a_thread_started_after_enable_is_charged_and_stops_with_disable():
    x = torch.randn(64, 64, device=DEV)
    expected = (x.cpu() @ x.cpu()).relu().sum().item()
    twin = target.enable("trn2", lnc=2)
    try:
        # as a text streamer's generate() thread would
        assert _in_thread(lambda: (x @ x).relu().sum().item()) == pytest.approx(expected, rel=1e-5)
        s = target.summary()
        assert (s["launches"], s["fused_ops"]) == (2, 1)  # the sum joins the relu's launch
        assert {o["op"] for o in s["top_ops"]} == {"aten::mm", "aten::relu", "aten::sum"}
        with pytest.raises(TypeError, match="no such type"):  # the target's rules hold there too
            _in_thread(lambda: torch.ones(2, device=DEV, dtype=torch.complex128) * 2)
    finally:
        target.disable()
    assert not twin.enabled and target.active() is None
    assert _in_thread(lambda: (x @ x).relu().sum().item()) == pytest.approx(expected, rel=1e-5)


def _launches(fn) -> tuple:
    torch.neuron.synchronize()
    with target.measure() as w:
        fn()
    return w.summary["launches"], w.summary["fused_ops"]


def test_eager_fusion_joins_a_dependent_element_wise_run_until_a_read(twin):
    x, y = torch.randn(1 << 16, device=DEV), torch.randn(1 << 16, device=DEV)
    chain = lambda: ((x * 1.5 + 0.25).relu() * 2).sum()  # noqa: E731
    chain()  # the signatures' compiles
    assert _launches(chain) == (1, 4)
    assert _launches(lambda: (x * 2, y * 3)) == (2, 0)  # independent: each its own launch

    def read_between():
        a = x * 2
        a[0].item()  # a read ends the fusion window
        return a + 1
    assert _launches(read_between) == (2, 0)
    assert _launches(lambda: torch.mm(x.view(256, 256), y.view(256, 256)).relu()) == (2, 0)  # not after a matmul
    torch.use_deterministic_algorithms(True)
    try:
        assert _launches(chain) == (5, 0)  # deterministic algorithms turn it off, as on the target
    finally:
        torch.use_deterministic_algorithms(False)
    # Joined operators pay no launch, and their read of the previous result stays on chip.
    with target.measure() as w:
        chain()
    joined = {o["op"]: o for o in w.summary["top_ops"]}
    assert joined["aten::relu"]["bytes"] == x.nbytes  # written; its input was read on chip
    assert joined["aten::sum"]["seconds"] < figures.LAUNCH_US["trn2"] * 1e-6


# ---------------------------------------------------------------- the cost report
SUMMARY = {"target": "trn2", "device": "Trainium2", "lnc": 2, "steps": 10, "device_s": 0.5, "compile_s": 30.0,
           "eager_compiles": 30, "graph_compiles": 0, "bound_s": {"launch": 0.3, "compute": 0.2},
           "top_ops": [{"op": "aten::mm", "share": 0.4, "bound": "compute"}]}


def test_cost_per_workload_arithmetic():
    w = report.workload(SUMMARY, usd_per_hour=36.0, instance="trn2.48xlarge", data_parallel=64,
                        steps_per_epoch=100, tokens_per_step=4096)
    assert w["step_s"] == pytest.approx(0.05) and w["logical_cores_per_instance"] == 64 and w["instances"] == 1
    assert w["usd_per_step"] == pytest.approx(36.0 / 3600 * 0.05)
    assert w["epoch_s"] == pytest.approx(5.0) and w["usd_per_epoch"] == pytest.approx(36.0 / 3600 * 5.0)
    assert w["s_per_million_tokens"] == pytest.approx(0.05 / (4096 * 64) * 1e6)
    assert report.workload(SUMMARY, usd_per_hour=36.0, chips=16, data_parallel=65)["instances"] == 2
    with pytest.raises(ValueError, match="unknown trn2 instance"):
        report.workload(SUMMARY, usd_per_hour=1.0, instance="trn9.huge")
    with pytest.raises(ValueError, match="needs the instance"):
        report.workload(SUMMARY, usd_per_hour=1.0)


def test_the_report_command(tmp_path, capsys):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"target": SUMMARY}))
    assert report.main([str(path), "--usd-per-hour", "36", "--instance", "trn2.48xlarge",
                        "--tokens-per-step", "4096"]) == 0
    out = capsys.readouterr().out
    assert "Modelled on the target (not measured)" in out and "cost per step" in out, out
    assert "assumptions:" in out


# ---------------------------------------------------------------- start-up
def test_off_by_default_and_on_from_the_environment():
    # Off, nothing of the twin is on an operator's path: no dispatch mode, no thread hook, no
    # NKI launch observer, and its module is never imported.
    probe = """
        import json, sys, threading, torch, torchneuron.target as t
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
        from torchneuron.nki import torch_bridge
        p = torch.neuron.get_device_properties(0)
        x = torch.randn(4, device="neuron")
        (x * 2).sum().item()
        print(json.dumps({"active": t.active() is not None, "name": p.name,
                          "hooks": [type(m).__name__ for m in _get_current_dispatch_mode_stack()]
                                   + [h.__name__ for h in (threading.getprofile(), torch_bridge.launch_observer) if h],
                          "twin_imported": "torchneuron.target.twin" in sys.modules}))"""
    off = run_python(probe, unset=("TORCHNEURON_TARGET", "TORCHNEURON_MACHINE"))
    assert off.returncode == 0, off.stderr
    assert json.loads(off.stdout.splitlines()[-1]) == {"active": False, "name": "NeuronCore-v3 (emulated)",
                                                       "hooks": [], "twin_imported": False}
    on = run_python(probe, env={"TORCHNEURON_TARGET": "trn3"}, unset=("TORCHNEURON_MACHINE",))
    assert on.returncode == 0, on.stderr
    assert json.loads(on.stdout.splitlines()[-1]) == {"active": True, "name": "NeuronCore-v4 (emulated)",
                                                      "hooks": ["Twin", "adopt", "charge"], "twin_imported": True}


def test_a_target_that_contradicts_the_machine_or_a_bad_name_is_refused(monkeypatch):
    from torchneuron.environment import ConfigError

    monkeypatch.setenv("TORCHNEURON_TARGET", "trn3")
    monkeypatch.setenv("TORCHNEURON_MACHINE", "trn2")
    with pytest.raises(ConfigError, match="name different machines"):
        target._machine_from_environment()
    monkeypatch.setenv("TORCHNEURON_TARGET", "trn9")
    with pytest.raises(ConfigError, match="TORCHNEURON_TARGET"):
        target._machine_from_environment()


# ---------------------------------------------------------------- a Hugging Face model
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).to(DEV)


def test_llama_training_is_modelled_without_a_false_finding(twin):
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (4, 32), device=DEV)

    def train():
        for _ in range(3):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()

    with target.measure(steps=3) as w:
        found = target_warnings(train)
    assert found == []  # fixed shapes, token ids far below 2**31: nothing differs on the target
    s = w.summary
    assert s["device_s_per_step"] > 0 and s["eager_compiles"] > 0
    assert {"aten::mm", "aten::bmm", "aten::addmm"} & {o["op"] for o in s["top_ops"]}


def test_llama_generation_reports_the_growing_kv_cache_as_shape_churn(twin):
    model = tiny_llama().eval()
    ids = torch.randint(0, 256, (1, 8), device=DEV)
    found = [m for m in target_warnings(lambda: model.generate(ids, max_new_tokens=8, do_sample=False))
             if "shape churn" in m]
    by_file = {m.split(" at ")[1].split(":")[0].rsplit("/", 1)[-1]: m for m in found}
    assert "dimension 2 of tensor argument 0 takes 8, 9, 10, 11" in by_file["cache_utils.py"]  # the KV cache's cat
    assert "dimension 1 of tensor argument 0 takes 8, 9, 10, 11" in by_file["utils.py"]  # the generated ids' cat


# ---------------------------------------------------------------- the profiler and the explorer
def test_a_profiled_run_carries_the_twins_account_into_the_explorer(twin, tmp_path):
    import torchneuron.explorer as explorer

    x = torch.randn(64, 64, device=DEV)
    (x @ x).sum().item()  # before the profiler: not in its account
    with torch.profiler.profile() as prof:
        for _ in range(3):
            (x @ x).relu().sum().item()
    summary = target.profile_summary()
    # mm, then relu with the sum joined to its launch, per iteration; item() reads, launching nothing
    assert (summary["launches"], summary["fused_ops"]) == (3 * 2, 3)
    prof.export_chrome_trace(str(tmp_path / "raw.json"))
    raw = explorer.load_trace(str(tmp_path / "raw.json"))
    assert target.TRACE_KEY not in raw
    trace = target.add_model_to_trace(explorer.load_trace(str(tmp_path / "raw.json")))  # as explorer.report(prof) does
    model = explorer.analyze(trace)["summary"]["target"]
    assert model["target"] == "trn2" and model["launches"] == 6
    assert model["device_us"] == pytest.approx(summary["device_s"] * 1e6)
    assert {o["op"] for o in model["top_ops"]} == {"aten::mm", "aten::relu", "aten::sum"}
    row = [e for e in trace["traceEvents"] if e.get("pid") == target.TIMELINE_PID and e.get("ph") == "X"]
    assert [e["name"] for e in row] == ["aten::mm", "aten::relu", "aten::sum"] * 3  # the second, modelled timeline
    # In issue order, never overlapping; apart only where the device waits for the host (each item()).
    assert all(b["ts"] >= a["ts"] + a["dur"] - 1e-3 for a, b in zip(row, row[1:]))
    gaps = sum(b["ts"] - a["ts"] - a["dur"] for a, b in zip(row, row[1:]))
    assert gaps > 0 and gaps == pytest.approx(summary["bound_s"].get("host", 0) * 1e6, rel=1e-3, abs=0.1)
    assert sum(e["dur"] for e in row) + gaps == pytest.approx(summary["device_s"] * 1e6, rel=1e-3)
    # The modelled row is not taken for device tasks.
    with_row, without = explorer.analyze(trace)["summary"], explorer.analyze(raw)["summary"]
    assert (with_row["device_tasks"], with_row["window_us"]) == (without["device_tasks"], without["window_us"])


def test_a_dtype_the_target_lacks_is_refused_naming_it():
    z = torch.zeros(3, dtype=torch.complex64, device=DEV)  # off: the device has every dtype
    assert z.dtype == torch.complex64
    target.enable("trn2")
    try:
        with pytest.raises(TypeError, match="complex64 tensor on neuron:0: Trainium2's NeuronCores have no such type"):
            torch.zeros(3, dtype=torch.complex64, device=DEV)
        torch.zeros(3, dtype=torch.float8_e4m3fn, device=DEV)  # cFP8: the target has it
        with pytest.raises(TypeError, match="float8_e8m0fnu"):
            torch.zeros(3, dtype=torch.float8_e8m0fnu, device=DEV)
        target.enable("trn3")
        torch.zeros(3, dtype=torch.float8_e8m0fnu, device=DEV)  # an MX scale: NeuronCore-v4 has it
    finally:
        target.disable()


def test_an_nki_kernel_is_charged_the_nki_performance_models_latency(twin):
    import numpy as np

    from torchneuron import nki
    from torchneuron.nki import language as nl, perf

    @nki.jit
    def add_kernel(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a) + nl.load(b))
        return out

    a, b = (torch.randn(128, 512) for _ in range(2))
    before = target.summary()
    for _ in range(3):
        out = add_kernel(a.to(DEV), b.to(DEV))
    assert torch.equal(out.cpu(), a + b)
    charged = {o["op"]: o for o in target.summary()["top_ops"]}["nki::add_kernel"]
    latency_s = perf.estimate(add_kernel, a.numpy(), b.numpy(), machine="trn2").latency_ns * 1e-9
    assert charged["count"] == 3
    assert charged["seconds"] == pytest.approx(3 * (latency_s + figures.LAUNCH_US["trn2"] * 1e-6))
    assert target.summary()["eager_compiles"] - before["eager_compiles"] >= 1  # the kernel's signature, once


# ---------------------------------------------------------------- collectives
def _collectives_on_trn2(rank, world, port):
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.neuron.set_device(rank)
    dist.init_process_group("neuron", rank=rank, world_size=world)
    try:
        twin = target.enable("trn2", lnc=2)
        t = torch.full((1 << 22,), float(rank + 1), device=DEV)
        dist.all_reduce(t)
        outs = [torch.empty(1 << 10, device=DEV) for _ in range(world)]
        dist.all_gather(outs, torch.full((1 << 10,), float(rank), device=DEV))
        s = target.summary()
        return {"sum": t[0].item(), "ops": {o["op"]: o for o in s["top_ops"]}, "bound_s": s["bound_s"],
                "link": twin.core.link_bytes_per_s, "launch": twin.core.launch_s}
    finally:
        target.disable()
        dist.destroy_process_group()


def test_collectives_are_charged_as_a_ring_over_neuronlink():
    from distributed_testing import spawn_ranks

    ranks = spawn_ranks(_collectives_on_trn2, 2)
    for r in ranks.values():
        assert r["sum"] == 3.0
        assert r["link"] == pytest.approx(1.28e12 / 4)  # a logical core's share of the chip's NeuronLink (LNC=2)
        reduce = next(o for name, o in r["ops"].items() if "allreduce" in name)
        # A ring all-reduce of 2 ranks sends 2 * (1/2) of the 16 MiB tensor.
        latency = figures.COLLECTIVE_LATENCY_US["trn2"] * 1e-6
        assert reduce["seconds"] == pytest.approx(latency + (1 << 22) * 4 / r["link"] + r["launch"])
        assert reduce["bound"] == "collective"
        gather = next(o for name, o in r["ops"].items() if "allgather" in name)
        assert gather["seconds"] == pytest.approx(latency + 0.5 * 2 * (1 << 10) * 4 / r["link"] + r["launch"])
        assert r["bound_s"]["collective"] > 0


def test_a_gather_is_charged_by_the_rows_it_picks_not_its_whole_table():
    core = figures.logical_core("trn2", 2)
    table, ids = torch.randn(50_000, 256), torch.tensor([[3, 7]])
    one_token = op_cost(torch.ops.aten.embedding.default, (table, ids), {}, table[ids], core)
    assert one_token.elements == 2 * 256
    assert one_token.bytes == 2 * (2 * 256 * 4) + 2 * 4  # the rows read and written, the int64 ids as int32
