"""torch.compile(backend="neuron"): compiled neuron against eager neuron and the CPU.

Inductor's C++ compiles are slow on a small machine, so the models are tiny
and each is compiled once per test. Kernels land in Inductor's on-disk cache
(TORCHINDUCTOR_CACHE_DIR), so a second run of this file is much faster.
"""
import copy
import os
import signal
import sys
import time
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchneuron  # noqa: F401
import torchneuron.compile as tnc
from neuron_testing import CPU_LEVELS, run_python, skip_above_host

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import gpt_model as gm  # noqa: E402

RTOL = 1e-5
DEV = torch.device("neuron")
# Under the stream sanitizer every compiled kernel runs through the launcher, which reports it: replay is off.
NO_REPLAY = "replay is off under it (it sees each kernel as launched), so nothing is recorded or replayed"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    tnc.backend.stats.clear()
    tnc.replay.stats.clear()
    tnc.replay.reasons.clear()
    tnc.launch.stats.clear()
    yield
    torch._dynamo.reset()


def _close(a, b, rtol=RTOL, atol=1e-6):
    torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=rtol, atol=atol)


def _train(model, inputs, targets, steps, loss_fn, compiled=False, compile_opt=False, **compile_kw):
    """A few optimizer steps; returns the losses (floats) and the final parameters."""
    opt = torch.optim.AdamW(model.parameters(), lr=0.01) if compile_opt else \
        torch.optim.SGD(model.parameters(), lr=0.05)

    def forward_loss(x, y):
        return loss_fn(model(x), y)

    fn = torch.compile(forward_loss, backend="neuron", **compile_kw) if compiled else forward_loss
    opt_step = torch.compile(opt.step, backend="neuron") if compiled and compile_opt else opt.step
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = fn(inputs, targets)
        loss.backward()          # the compiled backward graph (AOTAutograd)
        opt_step()
        losses.append(loss.detach())
    return [float(l) for l in losses], [p.detach().cpu() for p in model.parameters()]


def _three_way(make_model, x, y, loss_fn, steps=3, compile_opt=False, **compile_kw):
    """Training losses and parameters: compiled neuron vs eager neuron vs CPU."""
    torch.manual_seed(0)
    base = make_model()
    cpu_losses, cpu_params = _train(copy.deepcopy(base), x, y, steps, loss_fn, compile_opt=compile_opt)
    eager_losses, eager_params = _train(copy.deepcopy(base).to(DEV), x.to(DEV), y.to(DEV), steps, loss_fn,
                                        compile_opt=compile_opt)
    comp_losses, comp_params = _train(copy.deepcopy(base).to(DEV), x.to(DEV), y.to(DEV), steps, loss_fn,
                                      compiled=True, compile_opt=compile_opt, **compile_kw)
    assert eager_losses == cpu_losses  # eager neuron runs the CPU's kernels: bit for bit
    for c, e in zip(comp_losses, eager_losses):
        assert c == pytest.approx(e, rel=RTOL)
    # parameters: AdamW normalises near-zero gradients, where float32 rounding
    # differences of ~1e-9 become update differences of ~lr * 1e-3
    for c, e in zip(comp_params, eager_params):
        _close(c, e, rtol=1e-4, atol=1e-4)
    return comp_losses


# ------------------------------------------------------------------ models

def test_mlp_forward_and_training():
    torch.manual_seed(0)
    x, y = torch.randn(16, 12), torch.randint(0, 5, (16,))
    make = lambda: nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 5))  # noqa: E731
    # forward, inference
    model = make()
    m = copy.deepcopy(model).to(DEV)
    with torch.no_grad():
        out = torch.compile(m, backend="neuron")(x.to(DEV))
        assert out.device.type == "neuron"
        _close(out, model(x))
    _three_way(make, x, y, F.cross_entropy)
    ops = torchneuron.get_executed_ops()
    assert any(k.startswith("compiled::cpp_fused") for k in ops), ops


def test_conv_net_training():
    class ConvNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.fc = nn.Linear(4 * 4 * 4, 3)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
            return self.fc(x.flatten(1))

    torch.manual_seed(0)
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 3, (4,))
    _three_way(ConvNet, x, y, F.cross_entropy, steps=2)


def _kernels_generated(fn) -> int:
    from torch._inductor import metrics

    metrics.reset()
    fn()
    return metrics.generated_kernel_count


def test_conv_net_lays_out_as_inductor_on_the_cpu():
    # neuron convolutions are the CPU's (oneDNN), so Inductor keeps a conv net
    # channels-last as it does on the CPU: the same kernels (one converting the
    # input and weights, one fused kernel per conv block: batch norm, ReLU,
    # pooling), and the convolutions compute into device memory, no copies
    # (after the first call, which finds out which of oneDNN's allocations is
    # the result)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2)).eval()
    x = torch.randn(4, 3, 16, 16)
    torch._dynamo.reset()
    ccpu = torch.compile(copy.deepcopy(model), backend="inductor")
    cm = torch.compile(copy.deepcopy(model).to(DEV), backend="neuron")
    with torch.no_grad():
        on_cpu = _kernels_generated(lambda: ccpu(x))
        torchneuron.clear_op_tracking()
        on_neuron = _kernels_generated(lambda: _close(cm(x.to(DEV)), model(x), atol=1e-5))
    assert on_neuron == on_cpu, (on_neuron, on_cpu)
    ops = torchneuron.get_executed_ops()
    assert ops.get("aten::convolution") == 2, ops
    assert len([k for k in ops if k.startswith("compiled::")]) == 3, ops
    torch.neuron.synchronize()
    before = torchneuron._C._result_placement_counts()
    with torch.no_grad():
        cm(x.to(DEV))
    torch.neuron.synchronize()
    after = torchneuron._C._result_placement_counts()
    assert {k: after[k] - before[k] for k in before} == {"in_place": 2, "copied": 0}


@pytest.mark.parametrize("channels_last", [False, True])
def test_compiled_conv_strides_are_the_cpus(channels_last):
    # the result and gradient layouts a compiled graph gives are eager's (the
    # CPU's, whose convolution neuron runs): channels-last in, channels-last out
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU()).to(memory_format=fmt)
    x = torch.randn(2, 4, 6, 6).contiguous(memory_format=fmt)
    results = {}
    for name, device, kw in (("cpu", "cpu", None), ("neuron", DEV, None), ("compiled", DEV, "neuron")):
        torch._dynamo.reset()
        m = copy.deepcopy(model).to(device)
        fn = torch.compile(m, backend=kw) if kw else m
        out = fn(x.to(device))
        out.sum().backward()
        results[name] = (out, m[0].weight.grad)
    for name in ("neuron", "compiled"):
        for got, want in zip(results[name], results["cpu"]):
            assert got.stride() == want.stride(), (name, got.stride(), want.stride())
            _close(got, want, atol=1e-5)


def test_gpt_training_fullgraph():
    cfg = gm.GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, d_model=16)
    torch.manual_seed(0)
    idx = torch.randint(0, 16, (2, 8))
    tgt = torch.randint(0, 16, (2, 8))

    class WithLoss(nn.Module):  # the demo model (GPT: embeddings, a Block, tied head), loss inside
        def __init__(self):
            super().__init__()
            self.gpt = gm.GPT(cfg, generator=torch.Generator().manual_seed(0))

        def forward(self, i):
            return self.gpt(i)[0]

    loss_fn = lambda logits, t: F.cross_entropy(logits.reshape(-1, logits.size(-1)), t.reshape(-1))  # noqa
    # forward + backward fullgraph, and the AdamW step compiled too
    _three_way(WithLoss, idx, tgt, loss_fn, steps=2, compile_opt=True, fullgraph=True)


# ------------------------------------------------------------------ Dynamo features

def test_graph_break_and_recompile_on_new_shape():
    def f(x):
        y = torch.sin(x) * 2
        torch._dynamo.graph_break()
        return y + x.cos()

    cf = torch.compile(f, backend="neuron")
    for n in (8, 8, 12):
        x = torch.randn(n)
        _close(cf(x.to(DEV)), f(x))
    # two graphs for the first shape; the new shape recompiles both (automatic
    # dynamic shapes then compile them once more with a symbolic size)
    assert tnc.backend.stats["graphs"] == 4, dict(tnc.backend.stats)
    x = torch.randn(20)
    _close(cf(x.to(DEV)), f(x))
    assert tnc.backend.stats["graphs"] == 4, "the dynamic graphs were not reused"


def test_dynamic_true_one_compilation():
    def f(x, w):
        return torch.relu(x @ w).sum(dim=0) + x.mean()

    cf = torch.compile(f, backend="neuron", dynamic=True)
    w = torch.randn(6, 3)
    for n in (5, 9, 17):
        x = torch.randn(n, 6)
        _close(cf(x.to(DEV), w.to(DEV)), f(x, w), rtol=1e-5, atol=1e-5)
    assert tnc.backend.stats["graphs"] == 1


def test_set_default_backend():
    prev = torch.compiler.get_default_backend()
    torch.compiler.set_default_backend("neuron")
    try:
        x = torch.randn(7)
        _close(torch.compile(lambda t: t * 3 + 1)(x.to(DEV)), x * 3 + 1)
        assert tnc.backend.stats["graphs"] == 1
    finally:
        torch.compiler.set_default_backend(prev)


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_modes(mode):
    def f(x, w):
        return F.gelu(x @ w) + 1

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    cf = torch.compile(f, backend="neuron", mode=mode)
    for _ in range(2):
        _close(cf(x.to(DEV), w.to(DEV)), f(x, w), atol=1e-5)
    assert tnc.backend.stats["graphs"] == 1


@pytest.mark.differs_under("stream_sanitizer", NO_REPLAY)
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_float32_tanh_is_the_cpus_compiled_and_replayed(mode):
    """torch.tanh, F.gelu(approximate="tanh") and GPT-2's gelu_new, compiled
    for neuron (and, with reduce-overhead, replayed) give the bits Inductor
    gives on the CPU, on bit patterns of every exponent, sign and NaN class."""
    def f(x):
        gelu_new = 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))
        return torch.tanh(x), F.gelu(x, approximate="tanh"), gelu_new

    x = torch.arange(-2**31, 2**31, 4099, dtype=torch.int64).to(torch.int32).view(torch.float32)
    want = torch.compile(f, backend="inductor")(x)
    cf = torch.compile(f, backend="neuron", mode=mode)
    for _ in range(3 if mode == "reduce-overhead" else 1):
        got = cf(x.to(DEV))
        for g, w in zip(got, want):
            assert torch.equal(g.cpu().view(torch.int32), w.view(torch.int32))
    if mode == "reduce-overhead":
        assert tnc.replay.stats["replays"] >= 1, dict(tnc.replay.stats)


def test_fallback_execution_and_clear_error(monkeypatch):
    import torch._inductor.compile_fx as cfx

    def broken(*a, **k):
        raise ValueError("injected compiler failure")

    monkeypatch.setattr(cfx, "compile_fx", broken)
    x = torch.randn(5)
    with pytest.raises(Exception, match=r"failed to compile graph \d+ .*injected compiler failure"):
        torch.compile(lambda t: t.exp(), backend="neuron")(x.to(DEV))
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = torch.compile(lambda t: t.exp(), backend="neuron", options={"fallback_execution": True})(x.to(DEV))
    _close(out, x.exp())
    assert any("running it eagerly" in str(m.message) for m in w)


# ------------------------------------------------------------------ reduce-overhead: record and replay

def _mlp():
    return nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 5))


@pytest.mark.differs_under("stream_sanitizer", NO_REPLAY)
def test_reduce_overhead_replays_with_fresh_outputs():
    torch.manual_seed(0)
    model = _mlp()
    m = copy.deepcopy(model).to(DEV)
    cm = torch.compile(m, backend="neuron", mode="reduce-overhead")
    xs = [torch.randn(16, 12) for _ in range(5)]
    torchneuron.clear_op_tracking()
    with torch.no_grad():
        outs = [cm(x.to(DEV)) for x in xs]   # warm-up, record, then 3 replays
    # every output still holds its own call's result: replays do not overwrite earlier outputs
    for x, out in zip(xs, outs):
        _close(out, model(x), atol=1e-5)
    assert tnc.replay.stats["recordings"] == 1 and tnc.replay.stats["replays"] == 3, dict(tnc.replay.stats)
    ops = torchneuron.get_executed_ops()
    replays = [k for k in ops if k.startswith("compiled::replay")]
    assert replays and sum(ops[k] for k in replays) == 3, ops


@pytest.mark.differs_under("stream_sanitizer", NO_REPLAY)
def test_reduce_overhead_training_matches_default():
    torch.manual_seed(0)
    x, y = torch.randn(16, 12), torch.randint(0, 5, (16,))
    losses = _three_way(_mlp, x, y, F.cross_entropy, steps=5, mode="reduce-overhead")
    # forward and backward graphs recorded once each, then replayed
    assert tnc.replay.stats["recordings"] == 2, dict(tnc.replay.stats)
    assert tnc.replay.stats["replays"] == 6, dict(tnc.replay.stats)
    assert losses[-1] < losses[0]


@pytest.mark.differs_under("stream_sanitizer", NO_REPLAY)
def test_reduce_overhead_input_mutation_and_new_shapes():
    def f(buf, x):
        buf.add_(x.sum(0))          # an input mutated in place, as optimizer steps do
        return torch.relu(x * 2) + buf

    cf = torch.compile(f, backend="neuron", mode="reduce-overhead", dynamic=True)
    buf_ref, buf = torch.zeros(4), torch.zeros(4, device=DEV)
    for n in (3, 3, 3, 3, 5, 5, 5):
        x = torch.randn(n, 4)
        ref = f(buf_ref, x)
        _close(cf(buf, x.to(DEV)), ref, atol=1e-5)
        _close(buf, buf_ref, atol=1e-5)
    # one graph, one recording per size, replays of both
    assert tnc.backend.stats["graphs"] == 1
    assert tnc.replay.stats["recordings"] == 2 and tnc.replay.stats["replays"] == 3, dict(tnc.replay.stats)


@pytest.mark.differs_under("stream_sanitizer", NO_REPLAY)
def test_reduce_overhead_falls_back_with_a_reason():
    f = torch.compile(lambda x: F.dropout(x, 0.5, training=True) * 2, backend="neuron", mode="reduce-overhead")
    x = torch.ones(64, device=DEV)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        outs = [f(x) for _ in range(4)]
    assert tnc.replay.stats["replays"] == 0 and tnc.replay.stats["not_recordable"] == 1
    assert any("random operator" in r for r in tnc.replay.reasons.values()), tnc.replay.reasons
    assert any("runs without replay" in str(m.message) for m in w)
    for o in outs:   # still dropout: zeros and 2 / (1 - p)
        assert set(o.cpu().unique().tolist()) <= {0.0, 4.0}
    assert not torch.equal(outs[2].cpu(), outs[3].cpu())


def test_replay_program_tensor_lists_copies_and_errors():
    # the C++ replay program directly: a tensor-list argument mixing a
    # per-call input and a static tensor, a new result copied into an output,
    # an out= operator writing a static buffer; a failing step is named
    from torchneuron import _C

    a, b = torch.arange(6.).reshape(2, 3).to(DEV), torch.ones(2, 3, device=DEV)
    buf = torch.empty(4, 3, device=DEV)

    def ref(is_static, slot, t):
        return is_static, slot, 0, list(t.shape), list(t.stride()), t.dtype

    prog = _C._CompiledReplay("compiled::replay_test", 0, [buf, b], [([4, 3], [3, 1], torch.float32)])
    prog.add_op("cat", "aten::cat", "", [[None, None]], {}, [(0, 0, ref(False, 0, a)), (0, 1, ref(True, 1, b))],
                [(0, -1, ref(False, 1, buf))])
    prog.add_op("cat_out", "aten::cat", "out", [[None, None]], {"out": None, "dim": 0},
                [(0, 0, ref(False, 0, a)), (0, 1, ref(False, 0, a)), (2, -1, ref(True, 0, buf))], [])
    assert len(prog) == 2
    # results: the fresh output, and row 1 of the static buffer (a view at byte offset 12)
    prog.set_results([(False, 1, 0, [], [], None), (True, 0, 12, [3], [1], torch.float32)])
    out, row = prog.launch([a], [])
    _close(out, torch.cat([a.cpu(), torch.ones(2, 3)]))
    _close(buf, torch.cat([a.cpu(), a.cpu()]))
    _close(row, a.cpu()[1])
    with torch.neuron.stream(torch.neuron.Stream()):   # bound to the recorded stream
        assert prog.launch([a], []) is None

    torch.neuron.synchronize()
    bad = _C._CompiledReplay("compiled::replay_bad", 0, [], [])
    bad.add_op("mm", "aten::mm", "", [None, None], {}, [(0, -1, ref(False, 0, a)), (1, -1, ref(False, 0, a))], [])
    bad.launch([a], [])
    with pytest.raises(RuntimeError, match=r"compiled::replay_bad: step 0 \(mm\) failed: .*cannot be multiplied"):
        torch.neuron.synchronize()


def test_compiled_kernel_error_is_raised_not_a_crash():
    # an out-of-range index trips the generated kernel's bounds check, which
    # throws inside the device task (C entry point, no Python)
    f = torch.compile(lambda w, i: w[i] * 2, backend="neuron")
    w = torch.randn(8, 4, device=DEV)
    _close(f(w, torch.tensor([1, 7], device=DEV)), w.cpu()[[1, 7]] * 2)
    with pytest.raises(RuntimeError, match="out of bounds|index"):
        f(w, torch.tensor([1, 9], device=DEV))
        torch.neuron.synchronize()


@pytest.mark.differs_under("stream_sanitizer", NO_REPLAY)
def test_float_and_host_scalar_kernels_run_without_python():
    # Kernels with a float argument (an unbacked float from .item()) or a host
    # scalar (a 0-dim CPU tensor: a Python float Dynamo passes as a float64
    # tensor, or the caller's own) are called through their C entry points,
    # like the others, never through their Python bindings (GIL).
    def f(a, b, c, d, e, g, t, s):
        # one kernel: 7 pointers (more than the 6 integer argument registers
        # of x86-64), a float and a host scalar
        return ((a + b * c - d) * e / g).clamp(max=t.item()) * s + s

    xs = [torch.randn(64) for _ in range(6)]
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        cf = torch.compile(f, backend="neuron")
        for v, s in ((0.5, 2.0), (0.25, -3.0), (1.5, 0.75)):
            t = torch.tensor(v)
            _close(cf(*[x.to(DEV) for x in xs], t.to(DEV), s), f(*xs, t, s), atol=1e-5)
    assert tnc.launch.stats["entry_point"] >= 3 and tnc.launch.stats["binding"] == 0, dict(tnc.launch.stats)

    # the caller's 0-dim CPU tensor: read when the call queues the kernel
    # (program order), though the kernel runs after queued device work
    g = torch.compile(lambda x, k: (x * k).relu(), backend="neuron")
    x, k = torch.randn(256, 256, device=DEV), torch.tensor(2.0)
    g(x, k)
    torch.neuron.synchronize()
    busy = [x @ x for _ in range(4)]
    y = g(x, k)
    k.fill_(-1.0)
    _close(y, (x.cpu() * 2).relu())
    del busy

    # replayed (mode="reduce-overhead"): the Python float as the graph's host scalar input
    def h(x, s):
        return (x * s).relu() + s

    ch = torch.compile(h, backend="neuron", mode="reduce-overhead")
    x = torch.randn(64, device=DEV)
    for s in (0.5, 0.7, 1.5, 2.5, -3.0):
        _close(ch(x, s), h(x.cpu(), s), atol=1e-6)
    assert tnc.replay.stats["replays"] >= 2, dict(tnc.replay.stats)
    assert tnc.replay.stats["binding_steps"] == 0 and tnc.launch.stats["binding"] == 0, \
        (dict(tnc.replay.stats), dict(tnc.launch.stats))


# ------------------------------------------------------------------ streams, random

def test_stream_order_and_asynchrony():
    s = torch.neuron.Stream()
    a = torch.randn(256, 256, device=DEV)
    f = torch.compile(lambda x: (x * 2).relu() + 1, backend="neuron")
    f(a)  # compile outside the measured part
    torch.neuron.synchronize()
    with torch.neuron.stream(s):
        b = a @ a @ a          # queued eager work producing the input
        c = f(b)               # compiled kernels queued after it, same stream
        d = c.sum()
    ref = ((a.cpu() @ a.cpu() @ a.cpu()) * 2).relu() + 1
    s.synchronize()
    _close(c, ref, rtol=1e-4, atol=1e-3)
    _close(d, ref.sum(), rtol=1e-4, atol=1e-1)


def test_random_ops_use_the_device_generator():
    f = torch.compile(lambda x: x + torch.rand_like(x), backend="neuron")
    x = torch.zeros(1000, device=DEV)
    cpu_state = torch.get_rng_state()
    torch.neuron.manual_seed(3)
    a = f(x)
    torch.neuron.manual_seed(3)
    b = f(x)
    c = f(x)
    assert torch.equal(torch.get_rng_state(), cpu_state), "the CPU generator was used"
    assert torch.equal(a.cpu(), b.cpu())          # reproducible per device seed
    assert not torch.equal(b.cpu(), c.cpu())      # and the device generator advances
    assert 0.4 < float(a.mean()) < 0.6


# ------------------------------------------------------------------ on-disk cache

_CACHE_SCRIPT = """
import time, torch, torchneuron, torchneuron.compile
from torch._dynamo.utils import counters
f = torch.compile(lambda x: (x.sin() * 3).sum(dim=1), backend="neuron")
x = torch.arange(12.0, device="neuron").view(3, 4)
t0 = time.perf_counter(); y = f(x); torch.neuron.synchronize(); t = time.perf_counter() - t0
assert torch.allclose(y.cpu(), (torch.arange(12.0).view(3, 4).sin() * 3).sum(dim=1))
print("RESULT", t, counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"])
"""


def test_second_process_reuses_the_cache(tmp_path):
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
    results = []
    for _ in range(2):
        p = run_python(_CACHE_SCRIPT, env=env, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        line = [l for l in p.stdout.splitlines() if l.startswith("RESULT")][-1].split()
        results.append((float(line[1]), int(line[2]), int(line[3])))
    (cold, hit0, miss0), (warm, hit1, miss1) = results
    print(f"first compile {cold:.2f} s (cache misses {miss0}), second process {warm:.2f} s (hits {hit1})")
    assert miss0 >= 1 and hit1 >= 1 and miss1 == 0
    assert warm < cold


def test_graph_on_second_device():
    if torch.neuron.device_count() < 2:
        pytest.skip("one neuron device")
    x = torch.randn(6)
    f = torch.compile(lambda t: (t.sin() * 2).sum() + t, backend="neuron")
    y = f(x.to("neuron:1"))   # the current device stays neuron:0
    assert y.device == torch.device("neuron", 1)
    _close(y, (x.sin() * 2).sum() + x)


# A graph cached at one vector ISA must not be loaded at another: its kernels
# would be compiled for the other vector width (torchneuron/compile/codegen_config.py).
_ISA_SCRIPT = """
import torch, torchneuron, torchneuron.compile
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch._inductor.cpu_vec_isa import pick_vec_isa

def loss(x):
    return F.max_pool2d(x, 2).sum()

x0 = torch.randn(8, 16, 32, 32, generator=torch.Generator().manual_seed(0))
ref = x0.clone().requires_grad_()
loss(ref).backward()
for device, backend in (("neuron", "neuron"), ("cpu", "inductor")):
    x = x0.to(device).requires_grad_()
    f = torch.compile(loss, backend=backend)
    for step in range(3):  # each step's gradient buffer is the last one's memory, reused
        x.grad = None
        f(x).backward()
        assert torch.equal(x.grad.cpu(), ref.grad), (device, step, (x.grad.cpu() != ref.grad).sum().item())
print("RESULT", pick_vec_isa().bit_width(), counters["inductor"]["fxgraph_cache_hit"])
"""


def _run_at_capability(script: str, cache: str, capability: str | None, autoload: str = "1") -> tuple[int, int]:
    """(vector bits, FX graph cache hits) of `script` run in a child at ATen's CPU capability (None: the host's)."""
    env = {"TORCHINDUCTOR_CACHE_DIR": cache, "TORCH_DEVICE_BACKEND_AUTOLOAD": autoload}
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability
    p = run_python(script, env=env, timeout=300, unset=("ATEN_CPU_CAPABILITY",))
    assert p.returncode == 0, (capability, p.stdout[-2000:] + p.stderr[-3000:])
    bits, hits = [l for l in p.stdout.splitlines() if l.startswith("RESULT")][-1].split()[1:]
    return int(bits), int(hits)


def _lower_capability(native_bits: int) -> str:
    if native_bits == 0:
        pytest.skip("Inductor generates no vector code on this host: there is no vector width to mismatch")
    return "avx2" if native_bits > 256 else "default"


def test_cached_graphs_are_keyed_on_the_vector_isa(tmp_path):
    cache = str(tmp_path / "inductor")
    native_bits, _ = _run_at_capability(_ISA_SCRIPT, cache, None)
    lower = _lower_capability(native_bits)
    lower_bits, lower_hits = _run_at_capability(_ISA_SCRIPT, cache, lower)
    assert lower_bits < native_bits and lower_hits == 0, "a graph cached at another vector ISA was loaded"
    _, native_hits = _run_at_capability(_ISA_SCRIPT, cache, None)
    assert native_hits >= 1  # the cache still serves its own ISA


def test_the_cache_key_holds_the_isa_and_torchneurons_code_shaping_sources():
    from torch._inductor.codegen.common import custom_backend_codegen_configs
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    from torchneuron.compile import codegen_config, inductor_device

    tnc.register()
    assert custom_backend_codegen_configs["neuron"] is codegen_config
    assert codegen_config.vec_isa == str(pick_vec_isa())
    assert codegen_config.source_key == inductor_device._source_key() and len(codegen_config.source_key) == 64


_STOCK_SCRIPT = """
import torch
from torch._dynamo.utils import counters
from torch._inductor.cpu_vec_isa import pick_vec_isa
torch.compile(lambda x: (x.sin() * 3).sum(dim=1))(torch.randn(64, 64))
print("RESULT", pick_vec_isa().bit_width(), counters["inductor"]["fxgraph_cache_hit"])
"""


def test_stock_inductor_still_ignores_the_vector_isa_in_its_cache_key(tmp_path):
    """Upstream, not neuron: without torchneuron, Inductor's FX graph cache
    serves a CPU graph generated for one vector ISA to a process at another
    (a max_pool2d backward then corrupts the heap or computes garbage
    indices). When this fails, PyTorch keys on the ISA itself, and
    codegen_config.vec_isa can go."""
    cache = str(tmp_path / "inductor")
    native_bits, _ = _run_at_capability(_STOCK_SCRIPT, cache, None, autoload="0")
    lower_bits, lower_hits = _run_at_capability(_STOCK_SCRIPT, cache, _lower_capability(native_bits), autoload="0")
    assert lower_bits < native_bits and lower_hits >= 1


_POOL_GRAD_SCRIPT = """
import torch
import torch.nn.functional as F
from torch._inductor.cpu_vec_isa import pick_vec_isa
{setup}
def head(x):  # a conv net's end: max_pool2d, then the mean over the map
    return F.adaptive_avg_pool2d(F.max_pool2d(x, 2), 1).flatten(1)

x0 = torch.randn(16, 32, 16, 16, generator=torch.Generator().manual_seed(0))
go = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
ref = x0.clone().requires_grad_()
head(ref).backward(go)
x = x0.to({device!r}).requires_grad_()
torch.compile(head, backend={backend!r})(x).backward(go.to({device!r}))
print("RESULT", pick_vec_isa().bit_width(), (x.grad.cpu() - ref.grad).abs().max().item())
"""


def _pool_grad_child(tmp_path, capability, device, backend, setup="", autoload="1"):
    """_POOL_GRAD_SCRIPT run in a child at ATen's CPU capability `capability` (skipped where the host is
    below it)."""
    skip_above_host(capability)
    script = _POOL_GRAD_SCRIPT.format(setup=setup, device=device, backend=backend)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TORCH_DEVICE_BACKEND_AUTOLOAD": autoload,
           "ATEN_CPU_CAPABILITY": capability}
    return run_python(script, env=env, timeout=300)


def _result(p) -> tuple[int, float]:
    """(vector bits, max |compiled gradient - eager CPU gradient|) the child printed."""
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    bits, error = [l for l in p.stdout.splitlines() if l.startswith("RESULT")][-1].split()[1:]
    return int(bits), float(error)


@pytest.mark.parametrize("capability", sorted(level.lower() for level in CPU_LEVELS))
def test_max_pool_backward_is_exact_at_every_vector_isa(tmp_path, capability):
    """The gradient of max_pool2d then a mean, compiled on neuron at each ISA the host runs: bit for bit
    eager's. Inductor scatters that gradient with ATen's scatter_reduce on the CPU, and neuron takes the
    same choice (patch inductor-scatter-fallback). Without it neuron takes the generated atomic scatter,
    whose AVX2 code puts row r + i at 256 r + 512 i: wrong gradients (0.08 off here), or an 'index out
    of bounds' abort in a conv net's training step."""
    _, error = _result(_pool_grad_child(tmp_path, capability, "neuron", "neuron"))
    assert error == 0.0


def test_stock_inductors_generated_scatter_still_miscompiles_at_avx2(tmp_path):
    """Upstream, not neuron: stock Inductor on CPU tensors, without torchneuron, with its generated atomic
    scatter (config.cpp.fallback_scatter_reduce_sum off, as every non-CPU device has it) at AVX2. When
    this fails, PyTorch's AVX2 code for it is right, and patch inductor-scatter-fallback is no longer
    needed for correctness. The writes at wrong addresses fall past the gradient's buffer for the last
    rows, so the child either computes a wrong gradient or glibc aborts on the heap they corrupted."""
    setup = "import torch._inductor.config as config\nconfig.cpp.fallback_scatter_reduce_sum = False"
    p = _pool_grad_child(tmp_path, "avx2", "cpu", "inductor", setup=setup, autoload="0")
    if p.returncode in (-signal.SIGABRT, -signal.SIGSEGV):  # glibc's heap checks, or a wild read
        return
    bits, error = _result(p)
    assert bits == 256 and error > 1e-3


_SCALAR_FIRST = {
    "add": lambda s, a: s + a,
    "mul_add": lambda s, a: s * a + s,
    "pow": lambda s, a: torch.pow(s, a),
    "maximum": lambda s, a: torch.maximum(s.float(), a),
    "sum": lambda s, a: (s - a).sum(dim=1),
    "int_scalar": lambda s, a: s.long() * a,
}


@pytest.mark.parametrize("op", sorted(_SCALAR_FIRST))
def test_a_cpu_scalar_first_runs_on_the_device_in_stream_order(op):
    """A 0-dim CPU tensor (Dynamo's form of a Python scalar) as the first input of a pointwise op with a
    neuron tensor: the node runs on neuron, as eager does (patch inductor-pointwise-device), after the
    queued work that writes its input. Before, its kernel ran on the host at once, reading the input
    before the device had written it. Bit for bit Inductor's CPU result."""
    fn, s = _SCALAR_FIRST[op], torch.tensor(0.5, dtype=torch.float64)
    x = torch.rand(3, 7) + 1
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="neuron")
    want = torch.compile(fn, backend="inductor")(s, x)
    m = torch.randn(512, 512, device=DEV)
    for i in range(3):
        for _ in range(8):
            m = m @ m / 512.0  # the stream is busy when the input is queued
        a = x.to(DEV) * 1.0 + m[0, 0] * 0
        got = compiled(s, a)
        assert got.device == fn(s, a).device == torch.device("neuron", 0) and got.dtype == want.dtype
        assert torch.equal(got.cpu(), want), (op, i)


def test_a_cpu_kernel_reading_device_memory_is_refused_by_name():
    """Lowerings that place a node on their first input's device without asking which devices the others
    are on (addcmul with a CPU scalar as self) would give a CPU kernel reading neuron buffers on the host,
    out of stream order. The wrapper refuses it at compile time, naming the kernel and the buffers."""
    s, a = torch.tensor(0.5), torch.rand(3, 7, device=DEV)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match=r"kernel cpp_fused_addcmul_\d+ on cpu "
                       r"though it reads neuron buffers \(arg1_1\)"):
        torch.compile(lambda s, a: torch.addcmul(s, a, a), backend="neuron")(s, a)
    # CPU graphs are not affected
    _close(torch.compile(lambda s, a: torch.addcmul(s, a, a), backend="inductor")(s, a.cpu()),
           torch.addcmul(s, a.cpu(), a.cpu()))
