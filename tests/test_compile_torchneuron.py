"""torch.compile(backend="neuron") as TorchNeuron documents it: CPU inputs copied to the device
(with its opt-out), its fallback and device-placement variables, the compilation metrics
(torch_neuronx.get_dynamo_metrics) and torch_neuronx.neuron_dynamo_backend.

A CPU model compiled with backend="neuron" runs the same generated code as the model moved to
the device by hand, so the two agree bit for bit: values, gradients, buffers."""
import copy
import csv
import re
import warnings

import pytest
import torch
import torch.nn as nn

import torch_neuronx
from neuron_testing import run_python
from torch_neuronx import neuron_dynamo_backend as ndb

DEV = torch.device("neuron", 0)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    for name in ("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", "TORCH_NEURONX_RETAIN_DEVICE_MODE",
                 "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION"):
        monkeypatch.delenv(name, raising=False)
    torch._dynamo.reset()
    torch_neuronx.reset_dynamo_metrics()
    yield
    torch._dynamo.reset()


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def _train(model, xs, steps=3):
    """Compiled training steps; the losses, and the state at the end on the CPU."""
    c = torch.compile(model, backend="neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x in xs[:steps]:
        loss = c(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().cpu())
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


def test_a_cpu_model_trains_compiled_on_the_device_as_the_moved_model_does():
    xs = [torch.randn(6, 8) for _ in range(3)]
    on_cpu, moved = _model(), _model().to(DEV)
    cpu_losses, cpu_state = _train(on_cpu, xs)
    dev_losses, dev_state = _train(moved, [x.to(DEV) for x in xs])
    assert all(p.device.type == "cpu" for p in on_cpu.parameters())  # the model stays where it was
    assert [torch.equal(a, b) for a, b in zip(cpu_losses, dev_losses)] == [True] * 3
    for k in dev_state:  # weights (so gradients) and BatchNorm's running statistics, written back
        assert torch.equal(cpu_state[k], dev_state[k]), k
    assert int(cpu_state["1.num_batches_tracked"]) == 3


def test_outputs_are_on_the_device_and_a_mutated_input_is_written_back():
    def f(x, acc):
        acc.add_(x)
        return (x * 2).sum(1)

    x, acc, acc_ref = torch.randn(4, 5), torch.zeros(4, 5), torch.zeros(4, 5)
    out = torch.compile(f, backend="neuron")(x, acc)
    want = torch.compile(f, backend="inductor")(x, acc_ref)  # the same generated C++ on the host
    assert out.device == DEV
    assert torch.equal(out.cpu(), want) and torch.equal(acc, x) and torch.equal(acc_ref, x)


def test_sizes_that_change_recompile_with_the_cpu_inputs_dynamic():
    f = torch.compile(lambda x, w: (x @ w).relu(), backend="neuron")
    w = torch.randn(5, 3)
    for n in (2, 3, 4, 7):
        x = torch.randn(n, 5)
        assert torch.equal(f(x, w).cpu(), (x.to(DEV) @ w.to(DEV)).relu().cpu()), n


def test_gradients_of_cpu_inputs_come_back_to_the_cpu():
    x = torch.randn(3, 4, requires_grad=True)
    xd = x.detach().to(DEV).requires_grad_()
    f = torch.compile(lambda t: t.sin().sum(), backend="neuron")
    f(x).backward()
    f(xd).backward()
    assert x.grad.device.type == "cpu" and torch.equal(x.grad, xd.grad.cpu())


def test_the_opt_out_makes_a_cpu_input_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", "1")
    w = torch.randn(4, 4, device=DEV)
    f = lambda t: t.to(DEV) @ w  # noqa: E731
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed,
                       match=r"input 0 of graph \d+ .*is a CPU tensor \(2, 4\) torch.float32 and "
                             r"TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY is on"):
        torch.compile(f, backend="neuron")(torch.randn(2, 4))
    torch._dynamo.reset()
    x = torch.randn(2, 4)
    out = torch.compile(f, backend="neuron", options={"allow_cpu_inputs": True})(x)
    torch.testing.assert_close(out.cpu(), x @ w.cpu())
    monkeypatch.setenv("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", "maybe")
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed,
                       match="TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY='maybe' is invalid"):
        torch.compile(f, backend="neuron")(x)


def test_retain_device_mode_returns_a_cpu_graphs_outputs_on_the_cpu(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_RETAIN_DEVICE_MODE", "1")
    x = torch.randn(3, 4)
    a, b = torch.compile(lambda t: (t.exp(), t.sum()), backend="neuron")(x)
    assert a.device.type == b.device.type == "cpu"
    assert torch.equal(a, x.to(DEV).exp().cpu())
    # a graph with device inputs keeps its outputs on the device
    assert torch.compile(lambda t: t.exp(), backend="neuron")(x.to(DEV)).device == DEV


@pytest.mark.parametrize("value, falls_back", [("0", True), ("1", False), (None, False)])
def test_the_fallback_variable_decides_what_a_failed_compile_does(monkeypatch, value, falls_back):
    if value is not None:
        monkeypatch.setenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", value)

    def broken(gm, *args, **kwargs):
        raise RuntimeError("the compiler broke")

    monkeypatch.setattr("torch._inductor.compile_fx.compile_fx_inner", broken)
    x = torch.randn(3, device=DEV)
    f = torch.compile(lambda t: t.exp() + 1, backend="neuron")
    if falls_back:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert torch.equal(f(x).cpu(), (x.exp() + 1).cpu())
        assert any("running it eagerly" in str(m.message) for m in w)
    else:
        with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="the compiler broke"):
            f(x)


def test_metrics_record_each_graph_in_torchneurons_fields():
    ndb.set_model_name("tiny_mlp")
    model = _model().to(DEV)
    with torch._inductor.config.patch(force_disable_caches=True):
        torch.compile(model, backend="neuron")(torch.randn(4, 8, device=DEV)).sum().backward()
    records = torch_neuronx.get_dynamo_metrics()
    assert len(records) == 2
    # TorchNeuron's form: model name, AOTAutograd's graph id, the graph's kind and AOTAutograd's count
    aot_id = re.fullmatch(r"tiny_mlp_(\d+)_forward_\d+", records[0].graph_name).group(1)
    assert re.fullmatch(rf"tiny_mlp_{aot_id}_backward_\d+", records[1].graph_name), records[1]
    for r in records:
        assert isinstance(r, ndb.NeuronCompilationMetrics) and r.model_name == "tiny_mlp"
        assert r.graph_id and r.timestamp and r.graph_node_count > 5 and not r.has_collectives
        assert r.torch_neuronx_lower_us > 0 and r.torch_neuronx_compile_us > 0, r  # a cache miss
        assert r.torch_neuronx_fx_passes_us >= 0
    records[0].graph_name = "changed"  # a copy
    assert torch_neuronx.get_dynamo_metrics()[0].graph_name != "changed"
    counters = torch._dynamo.utils.counters["neuron"]
    assert counters["compiled_graphs"] == 2
    assert "torch_neuronx_compile" in torch._dynamo.utils.calculate_time_spent()
    torch_neuronx.reset_dynamo_metrics()
    assert torch_neuronx.get_dynamo_metrics() == [] and counters["compiled_graphs"] == 0


def test_a_graph_served_by_aotautograds_cache_is_recorded_as_loaded(tmp_path):
    """A second process finds forward and backward in AOTAutograd's on-disk cache: both are recorded,
    with no compile time."""
    code = """
        import torch, torch_neuronx
        x = torch.randn(5, device="neuron", requires_grad=True)
        torch.compile(lambda t: (t.cos() * 3).sum(), backend="neuron")(x).backward()
        print([(r.graph_name, r.torch_neuronx_compile_us) for r in torch_neuronx.get_dynamo_metrics()])
        """
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    first, second = run_python(code, env=env), run_python(code, env=env)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    kinds = lambda out: [re.sub(r"_\d+", "", n) for n, _ in eval(out.stdout.splitlines()[-1])]  # noqa: E731
    assert kinds(first) == ["model_default_forward", "model_default_backward"]
    assert kinds(second) == ["model_default_cached", "model_default_cached"]
    assert all(us == 0 for _, us in eval(second.stdout.splitlines()[-1]))


def test_collectives_are_noticed():
    from torchneuron.compile.metrics import _has_collectives

    def f(t):
        return torch.ops._c10d_functional.all_reduce(t, "sum", "0")

    assert _has_collectives(torch.fx.symbolic_trace(f))
    assert not _has_collectives(torch.fx.symbolic_trace(lambda t: t + 1))


def test_model_name_option_and_create_neuron_backend():
    backend = ndb.create_neuron_backend()
    x = torch.randn(3, device=DEV)
    out = torch.compile(lambda t: t * 2, backend=backend, options={"model_name": "named"})(x)
    assert torch.equal(out.cpu(), (x * 2).cpu())
    assert [r.model_name for r in torch_neuronx.get_dynamo_metrics()] == ["named"]
    with pytest.raises(TypeError, match="non-empty str"):
        ndb.set_model_name(3)


def test_the_graph_stats_table_is_written_at_exit(tmp_path):
    r = run_python("""
        import torch, torch_neuronx
        torch.compile(lambda t: t.exp(), backend="neuron")(torch.randn(3, device="neuron"))
        """, env={"TORCH_NEURONX_ENABLED_METRIC_TABLES": "graph_stats", "TORCH_NEURONX_METRICS_DIR": str(tmp_path),
                  "RANK": "3"})
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "metric_table_graph_stats_rank3.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and list(rows[0]) == [
        "graph_id", "graph_name", "model_name", "has_collectives", "graph_node_count", "timestamp",
        "torch_neuronx_fx_passes_us", "torch_neuronx_lower_us", "torch_neuronx_compile_us"]
    bad = run_python("import torch_neuronx", env={"TORCH_NEURONX_ENABLED_METRIC_TABLES": "graph_stats,speed"})
    assert bad.returncode != 0 and "unknown metric table(s) speed; the tables are: graph_stats" in bad.stderr
