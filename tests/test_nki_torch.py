"""NKI kernels from PyTorch: kernels on ``neuron`` tensors as device tasks, and ``nki_op``.

* A kernel called on neuron tensors returns neuron tensors at once and runs as
  one task on the current stream, ordered with the operators before and after it.
* An error inside such a kernel is raised at the next synchronising call,
  naming the kernel; errors the shape trace finds are raised at the call.
* ``nki_op`` operators match PyTorch in eager code, in ``torch.compile``
  (backends "eager", "aot_eager" and "neuron"), and in training steps with a
  registered backward.
* With backend "neuron", an ``nki_op`` operator and a ``torch_neuronx.wrap_nki``
  call are each one node of the graph, queued in the graph's order, with and
  without fullgraph; in-place kernels update their arguments.

The "aot_eager" cases call ATen operators through Python (torch.ops.aten.*),
which needs the generic executor to capture its OperatorHandle by value
(csrc/bridge/exec/launch.cpp, launch_queued: ``[op, &policy, ...]``);
with the by-reference capture they crash the process on the executor thread.
"""
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torchneuron  # noqa: E402,F401
import torchneuron.nki as nki  # noqa: E402
import torchneuron.nki.isa as nisa  # noqa: E402
import torchneuron.nki.language as nl  # noqa: E402
from torchneuron.nki import torch_bridge  # noqa: E402

if not torch.neuron.is_available():
    pytest.skip("the neuron device is not available", allow_module_level=True)

DEV = "neuron"


# ---------------------------------------------------------------------------
# kernels written for these tests

@nki.jit
def add_kernel(a, b):
    """a + b over rows in blocks of 128, one block per SPMD instance."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    rows = nl.program_id(0) * 128 + nl.arange(128)[:, None]
    cols = nl.arange(a.shape[1])[None, :]
    nl.store(out[rows, cols], value=nl.load(a[rows, cols]) + nl.load(b[rows, cols]))
    return out


@nki.jit
def matmul_kernel(a, b):
    """a @ b for (M, K) x (K, N), every dimension a multiple of 128; fp32 PSUM accumulation."""
    m_dim, k_dim = a.shape
    _, n_dim = b.shape
    tn = min(n_dim, 512)
    out = nl.ndarray((m_dim, n_dim), dtype=a.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(m_dim // 128):
        a_t = [nl.load_transpose2d(a[m * 128:(m + 1) * 128, k * 128:(k + 1) * 128]) for k in range(k_dim // 128)]
        for n in nl.affine_range(n_dim // tn):
            acc = nl.zeros((128, tn), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(k_dim // 128):
                acc += nisa.nc_matmul(stationary=a_t[k], moving=nl.load(b[k * 128:(k + 1) * 128, n * tn:(n + 1) * tn]))
            nl.store(out[m * 128:(m + 1) * 128, n * tn:(n + 1) * tn], value=nl.copy(acc, dtype=a.dtype))
    return out


@nki.jit
def rmsnorm_kernel(x, w, eps):
    """x * rsqrt(mean(x^2) + eps) * w over the last axis; ragged last row block masked."""
    rows, cols = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    ix = nl.arange(128)[:, None]
    iy = nl.arange(cols)[None, :]
    wt = nl.load(w.reshape((1, cols))[nl.arange(1)[:, None], iy]).broadcast_to((128, cols))
    for b in nl.affine_range((rows + 127) // 128):
        valid = b * 128 + ix < rows
        t = nl.load(x[b * 128 + ix, iy], mask=valid)
        ms = nl.mean(nl.square(t), axis=[1], keepdims=True)
        y = nl.multiply(nl.multiply(t, nl.rsqrt(ms + eps)), wt)
        nl.store(out[b * 128 + ix, iy], value=y, mask=valid)
    return out


GATE = threading.Event()
FLAGS = {"block": False, "fail": False}


@nki.jit(trace_cache=False)
def copy_kernel(a):
    """Copies a (at most 128 rows); blocks on GATE or fails when FLAGS say so.

    The flags are host state read at run time, which lets a test hold a task
    on the executor or make it fail after its signature was recorded.  That
    needs the kernel's Python to run on every call, so no trace replay."""
    if FLAGS["block"]:
        assert GATE.wait(20), "gate never opened"
    if FLAGS["fail"]:
        raise ValueError("copy_kernel was told to fail")
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(a))
    return out


@nki.jit
def too_wide_kernel(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(a))        # a has 256 rows: partition limit
    return out


@nki.jit
def scale_inplace_kernel(a, factor):
    """Multiplies a (<= 128 rows) by factor in place; returns nothing."""
    nl.store(a, value=nl.multiply(nl.load(a), factor))


# ---------------------------------------------------------------------------
# operators

matmul_op = nki.nki_op("nkitest::matmul", matmul_kernel, schema="(Tensor a, Tensor b) -> Tensor")


def _matmul_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _matmul_backward(ctx, grad):
    a, b = ctx.saved_tensors
    grad = grad.contiguous()
    return matmul_op(grad, b.t().contiguous()), matmul_op(a.t().contiguous(), grad)


matmul_op.register_autograd(_matmul_backward, setup_context=_matmul_setup)


@nki.nki_op("nkitest::rmsnorm", mutates_args=())
def rmsnorm_op(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return rmsnorm_kernel(x.contiguous(), w.contiguous(), eps)


def _rmsnorm_setup(ctx, inputs, output):
    x, w, eps = inputs
    ctx.save_for_backward(x, w)
    ctx.eps = eps


def _rmsnorm_backward(ctx, grad):
    # written with PyTorch operators (they run on the device too)
    x, w = ctx.saved_tensors
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + ctx.eps)
    gw = grad * w
    grad_x = r * gw - x * r.pow(3) * (gw * x).mean(-1, keepdim=True)
    grad_w = (grad * x * r).sum(0)
    return grad_x, grad_w, None


rmsnorm_op.register_autograd(_rmsnorm_backward, setup_context=_rmsnorm_setup)


@nki.nki_op("nkitest::scale_", mutates_args=("a",))
@nki.jit
def scale_op(a: torch.Tensor, factor: float) -> None:
    nl.store(a, value=nl.multiply(nl.load(a), factor))


def rmsnorm_ref(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


# ---------------------------------------------------------------------------
# kernels on neuron tensors

def test_kernel_on_neuron_tensors_returns_neuron_tensors():
    a = torch.randn(256, 192, device=DEV)
    b = torch.randn(256, 192, device=DEV)
    out = add_kernel[2](a, b)
    assert out.device.type == "neuron" and out.shape == a.shape and out.dtype == a.dtype
    torch.testing.assert_close(out.cpu(), a.cpu() + b.cpu())
    ah, bh = a.to(torch.bfloat16), b.to(torch.bfloat16)
    out = add_kernel[2](ah, bh)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu(), (ah.cpu().float() + bh.cpu().float()).to(torch.bfloat16))


def test_kernel_is_one_task_ordered_with_neighbouring_ops():
    torchneuron.clear_op_tracking()
    a = torch.randn(256, 64, device=DEV)
    b = torch.randn(256, 64, device=DEV)
    a_host, b_host = a.cpu(), b.cpu()
    x = a * 2                       # queued before the kernel: the kernel must see it
    out = add_kernel[2](x, b)
    x.add_(1000)                    # queued after: the kernel must not see it
    y = out + 1                     # queued after, reads the kernel's output
    torch.testing.assert_close(y.cpu(), a_host * 2 + b_host + 1)
    torch.testing.assert_close(x.cpu(), a_host * 2 + 1000)
    assert torchneuron.get_executed_ops().get("nki::add_kernel") == 1


def test_kernel_call_is_asynchronous():
    a = torch.randn(128, 64, device=DEV)
    copy_kernel(a)                  # records the signature
    GATE.clear()
    FLAGS["block"] = True
    try:
        start = time.perf_counter()
        out = copy_kernel(a)        # queued; the task waits for the gate on the executor
        assert time.perf_counter() - start < 5
        after = out * 3             # an operator queued behind the waiting kernel
        assert not torch.neuron.current_stream().query()
    finally:
        FLAGS["block"] = False
        GATE.set()
    torch.testing.assert_close(after.cpu(), a.cpu() * 3)


def test_kernel_runs_on_the_current_stream():
    side = torch.neuron.Stream()
    a = torch.randn(128, 32, device=DEV)
    b = torch.randn(128, 32, device=DEV)
    side.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(side):
        out = add_kernel(a, b)
        out2 = out * 2
    torch.neuron.current_stream().wait_stream(side)
    torch.testing.assert_close(out2.cpu(), (a.cpu() + b.cpu()) * 2)


def test_error_inside_kernel_is_raised_at_the_next_sync_naming_the_kernel():
    a = torch.randn(64, 16, device=DEV)
    copy_kernel(a).cpu()
    FLAGS["fail"] = True
    try:
        out = copy_kernel(a)        # the signature is known: queued without a trace
        with pytest.raises(RuntimeError) as err:
            out.cpu()
    finally:
        FLAGS["fail"] = False
    msg = str(err.value)
    assert "nki::copy_kernel" in msg and "copy_kernel was told to fail" in msg
    assert len(torch.neuron.reset_errors()) == 1  # sticky until reset
    # the device keeps working
    torch.testing.assert_close(copy_kernel(a).cpu(), a.cpu())


def test_error_found_by_the_shape_trace_is_raised_at_the_call():
    a = torch.randn(256, 16, device=DEV)
    with pytest.raises(nki.NKILimitError) as err:
        too_wide_kernel(a)
    assert "pmax" in str(err.value) and "test_nki_torch.py" in str(err.value)


def test_error_under_launch_blocking_is_raised_at_the_call():
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.dirname(__file__)!r})
        import torch, torchneuron
        import test_nki_torch as t
        a = torch.randn(64, 16, device="neuron")
        t.copy_kernel(a)
        t.FLAGS["fail"] = True
        try:
            t.copy_kernel(a)
        except RuntimeError as e:
            assert "nki::copy_kernel" in str(e), e
            print("raised at the call")
    """)
    env = dict(os.environ, NEURON_LAUNCH_BLOCKING="1", PYTHONPATH=ROOT)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert "raised at the call" in res.stdout, res.stdout + res.stderr


def test_kernel_writing_into_an_input_and_returning_nothing():
    a = torch.randn(128, 64, device=DEV)
    ref = a.cpu() * 3
    assert scale_inplace_kernel(a, 3.0) is None
    torch.testing.assert_close(a.cpu(), ref)


def test_signature_is_recorded_once():
    torch_bridge.clear_signature_cache()
    a = torch.randn(128, 256, device=DEV)
    b = torch.randn(256, 128, device=DEV)
    before = torch_bridge.signature_cache_info()
    for _ in range(3):
        out = matmul_kernel(a, b)
    info = torch_bridge.signature_cache_info()
    assert info["traces"] - before["traces"] == 1 and info["hits"] - before["hits"] == 2
    torch.testing.assert_close(out.cpu(), a.cpu() @ b.cpu(), rtol=1e-4, atol=1e-4)
    matmul_kernel(a[:, :128].contiguous(), b[:128])          # new shapes: new trace
    assert torch_bridge.signature_cache_info()["traces"] - before["traces"] == 2


def test_device_runs_replay_the_shape_trace():
    """The shape trace on the host records the kernel's program; device tasks replay it."""
    torch_bridge.clear_signature_cache()      # output records are per function: force a shape trace
    kernel = nki.jit(matmul_kernel.fn)
    a = torch.randn(128, 256, device=DEV)
    b = torch.randn(256, 128, device=DEV)
    outs = [kernel(a * i, b) for i in range(1, 4)]
    for i, out in enumerate(outs, 1):
        torch.testing.assert_close(out.cpu(), (a.cpu() * i) @ b.cpu(), rtol=1e-4, atol=1e-4)
    info = kernel.cache_info()
    assert info["traces"] == 1 and info["replays"] == 3 and info["interpreted"] == 0
    ac, bc = a.cpu(), b.cpu()
    torch.testing.assert_close(kernel(ac, bc), ac @ bc, rtol=1e-4, atol=1e-4)   # CPU tensors replay too
    assert kernel.cache_info()["replays"] == 4


def test_kernel_on_cpu_tensors_runs_on_the_host():
    a = torch.randn(128, 64)
    b = torch.randn(128, 64)
    out = add_kernel(a, b)
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, a + b)


# ---------------------------------------------------------------------------
# nki_op: eager, compiled, training

def test_nki_op_eager_matches_pytorch():
    x = torch.randn(300, 256, device=DEV)        # 300 rows: a ragged last block
    w = torch.randn(256, device=DEV)
    out = rmsnorm_op(x, w, 1e-6)
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), rmsnorm_ref(x.cpu(), w.cpu(), 1e-6), rtol=1e-4, atol=1e-4)
    a = torch.randn(128, 384, device=DEV)
    b = torch.randn(384, 512, device=DEV)
    torch.testing.assert_close(matmul_op(a, b).cpu(), a.cpu() @ b.cpu(), rtol=1e-4, atol=1e-4)


def test_nki_op_mutating_its_argument():
    a = torch.randn(128, 64, device=DEV)
    ref = a.cpu() * 0.5
    scale_op(a, 0.5)
    torch.testing.assert_close(a.cpu(), ref)


def test_nki_op_fake_implementation_gives_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.empty(200, 128, device=DEV))
        w = mode.from_tensor(torch.empty(128, device=DEV))
        out = rmsnorm_op(x, w, 1e-5)
        assert out.shape == (200, 128) and out.device.type == "neuron"
    torch.library.opcheck(rmsnorm_op, (torch.randn(130, 128, device=DEV), torch.randn(128, device=DEV), 1e-5),
                          test_utils=("test_schema", "test_faketensor"))


class Block(torch.nn.Module):
    def __init__(self, d=128, hidden=256):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(d, hidden) / d ** 0.5)
        self.w2 = torch.nn.Parameter(torch.randn(hidden, d) / hidden ** 0.5)
        self.g = torch.nn.Parameter(torch.ones(d))

    def forward(self, x, nki_ops=True):
        if nki_ops:
            h = torch.relu(matmul_op(rmsnorm_op(x, self.g, 1e-6), self.w1))
            return x + matmul_op(h, self.w2)
        h = torch.relu(rmsnorm_ref(x, self.g, 1e-6) @ self.w1)
        return x + h @ self.w2


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_nki_op_in_compiled_model(backend):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Block().to(DEV)
    x = torch.randn(256, 128, device=DEV)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        out = compiled(x)
        ref = model.cpu()(x.cpu(), nki_ops=False)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)


def _train(model, x, target, steps, nki_ops, compile_backend=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    fwd = (lambda inp: model(inp, nki_ops)) if compile_backend is None else \
        torch.compile(lambda inp: model(inp, nki_ops), backend=compile_backend)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(fwd(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("compile_backend", [None, "aot_eager"])
def test_nki_op_training_step_matches_pytorch(compile_backend):
    torch._dynamo.reset()
    torch.manual_seed(0)
    ref_model = Block()
    nki_model = Block().to(DEV)
    nki_model.load_state_dict(ref_model.state_dict())
    x = torch.randn(128, 128)
    target = torch.randn(128, 128)
    ref = _train(ref_model, x, target, 3, nki_ops=False)
    got = _train(nki_model, x.to(DEV), target.to(DEV), 3, nki_ops=True, compile_backend=compile_backend)
    np.testing.assert_allclose(got, ref, rtol=1e-4)
    assert got[-1] < got[0]
    for (name, p), (_, q) in zip(nki_model.named_parameters(), ref_model.named_parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-4, msg=name)


# ---------------------------------------------------------------------------
# the "neuron" compile backend: nki_op operators and wrap_nki calls as graph nodes

add_op = nki.nki_op("nkitest::add", add_kernel[1], schema="(Tensor a, Tensor b) -> Tensor")


def _compiled_code(fn, *args, fullgraph):
    """fn compiled with backend="neuron": its result and Inductor's wrapper code (all graphs)."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    out, code = run_and_get_code(torch.compile(fn, backend="neuron", fullgraph=fullgraph), *args)
    return out, "\n".join(code)


def _busy_stream():
    """Queues a few matmuls so the inputs made after them are written late on the executor."""
    m = torch.randn(512, 512, device=DEV)
    for _ in range(8):
        m = m @ m / 512.0
    return m[0, 0] * 0


def _around_add(a, b):
    # exact operators around the kernel: compiled and eager results are equal bit for bit
    return torch.relu(add_op(a * 2, b + 1) * 3) - b


@pytest.mark.parametrize("fullgraph", [True, False])
def test_nki_op_is_one_node_of_a_neuron_graph_in_stream_order(fullgraph):
    a = torch.randn(128, 64, device=DEV)
    b = torch.randn(128, 64, device=DEV)
    assert torch._dynamo.explain(_around_add)(a, b).graph_break_count == 0
    out, code = _compiled_code(_around_add, a, b, fullgraph=fullgraph)
    assert code.count("torch.ops.nkitest.add.default(") == 1, code
    assert torch.equal(out.cpu(), _around_add(a, b).cpu())
    compiled = torch.compile(_around_add, backend="neuron", fullgraph=fullgraph)
    for i in range(3):
        # the kernel's inputs are written by compiled kernels queued behind a busy stream, and
        # compiled kernels after it read its output: any reordering changes the result
        a = torch.randn(128, 64, device=DEV) + _busy_stream()
        got = compiled(a, b)
        assert torch.equal(got.cpu(), _around_add(a, b).cpu()), i


@pytest.mark.parametrize("fullgraph", [True, False])
def test_nki_op_mutating_its_argument_in_a_neuron_graph(fullgraph):
    def fn(x, y):
        z = x + 1
        scale_op(z, 0.5)        # an intermediate, written in place by the kernel
        scale_op(y, 2.0)        # a graph input, written in place: visible to the caller
        return z * 3 + y

    x = torch.randn(128, 64, device=DEV)
    y = torch.randn(128, 64, device=DEV)
    y_eager, y_compiled = y.clone(), y.clone()
    want = fn(x, y_eager)
    out, code = _compiled_code(fn, x, y_compiled + _busy_stream(), fullgraph=fullgraph)
    assert code.count("torch.ops.nkitest.scale_.default(") == 2, code
    y_compiled = y.clone()
    got = torch.compile(fn, backend="neuron", fullgraph=fullgraph)(x, y_compiled)
    assert torch.equal(got.cpu(), want.cpu()) and torch.equal(y_compiled.cpu(), y_eager.cpu())


@pytest.mark.parametrize("fullgraph", [True, False])
def test_nki_op_training_in_a_neuron_graph_matches_eager(fullgraph):
    torch.manual_seed(0)
    eager_model = Block().to(DEV)
    compiled_model = Block().to(DEV)
    compiled_model.load_state_dict(eager_model.state_dict())
    x = torch.randn(128, 128, device=DEV)
    target = torch.randn(128, 128, device=DEV)
    torch._dynamo.reset()
    fwd = torch.compile(compiled_model, backend="neuron", fullgraph=fullgraph)
    for model, f in ((eager_model, eager_model), (compiled_model, fwd)):
        torch.nn.functional.mse_loss(f(x), target).backward()
    for (name, p), (_, q) in zip(compiled_model.named_parameters(), eager_model.named_parameters()):
        # the backward's PyTorch operators are compiled (fused) on one side only: float rounding
        torch.testing.assert_close(p.grad.cpu(), q.grad.cpu(), rtol=1e-5, atol=1e-6, msg=name)


# wrap_nki callers (torch_neuronx.wrap_nki) in compiled graphs

@nki.jit
def axpy_kernel(y: nki.typing.mutable_tensor, x, alpha):
    """y += alpha * x in place (y declared mutable), returns y and a fresh copy of x."""
    copy = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    xt = nl.load(x)
    nl.store(copy, value=xt)
    nl.store(y, value=nl.add(nl.load(y), nl.multiply(xt, alpha)))
    return y, copy


def _wrapped():
    import torch_neuronx

    return torch_neuronx.wrap_nki(add_kernel), torch_neuronx.wrap_nki(scale_inplace_kernel), \
        torch_neuronx.wrap_nki(axpy_kernel)


@pytest.mark.parametrize("fullgraph", [True, False])
def test_wrap_nki_call_is_one_node_of_a_neuron_graph_in_stream_order(fullgraph):
    add, _, _ = _wrapped()

    def fn(a, b):
        return torch.relu(add[2](a * 2, b + 1) * 3) - b

    a = torch.randn(256, 64, device=DEV)
    b = torch.randn(256, 64, device=DEV)
    assert torch._dynamo.explain(fn)(a, b).graph_break_count == 0
    out, code = _compiled_code(fn, a, b, fullgraph=fullgraph)
    assert code.count("torch.ops.torchneuron_nki.call_o1.default(") == 1, code
    assert torch.equal(out.cpu(), fn(a, b).cpu())
    torchneuron.clear_op_tracking()
    compiled = torch.compile(fn, backend="neuron", fullgraph=fullgraph)
    for i in range(3):
        a = torch.randn(256, 64, device=DEV) + _busy_stream()
        got = compiled(a, b)
        assert torch.equal(got.cpu(), fn(a, b).cpu()), i
    assert torchneuron.get_executed_ops().get("nki::add_kernel") == 6   # 3 compiled + 3 eager, one task each


@pytest.mark.parametrize("fullgraph", [True, False])
def test_wrap_nki_kernels_writing_into_inputs_in_a_neuron_graph(fullgraph):
    _, scale, axpy = _wrapped()

    def fn(x, y):
        z = x + 1
        assert scale(z, 0.5) is None       # writes into z; no nt.mutable_tensor: found by running it
        y_again, x_copy = axpy(y, z, 2.0)  # writes into y (a graph input), declared, and returns it
        return z * 3, y_again + 1, x_copy - 1

    x = torch.randn(128, 64, device=DEV)
    y = torch.randn(128, 64, device=DEV)
    y_eager, y_compiled = y.clone(), y.clone()
    want = fn(x, y_eager)
    out, code = _compiled_code(fn, x, y_compiled, fullgraph=fullgraph)
    assert code.count("torch.ops.torchneuron_nki.call_o0_w.default(") == 1, code
    assert code.count("torch.ops.torchneuron_nki.call_o1_w.default(") == 1, code
    for w, g in zip(want, out):
        assert torch.equal(w.cpu(), g.cpu())
    assert torch.equal(y_compiled.cpu(), y_eager.cpu())


def test_wrap_nki_write_into_a_tensor_passed_twice_is_refused():
    """Found while Dynamo runs the call on fake tensors, which reports it (fullgraph=True) as an
    unsupported call caused by our error."""
    _, _, axpy = _wrapped()
    y = torch.randn(128, 64, device=DEV)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported) as err:
        torch.compile(lambda y: axpy(y, y, 1.0)[1], backend="neuron", fullgraph=True)(y)
    chain, e = [], err.value
    while e is not None:
        chain.append(str(e))
        e = e.__cause__ or e.__context__
    assert any("wrap_nki(axpy_kernel) in torch.compile: the kernel writes into tensor argument 0, which shares "
               "memory with tensor argument 1" in m for m in chain), chain
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match=r"wrap_nki\(axpy_kernel\) in torch.compile: the kernel writes into "):
        torch.compile(lambda y: axpy(y, y, 1.0)[1], backend="neuron")(y)


def test_wrap_nki_call_has_no_gradient_in_a_compiled_graph():
    add, _, _ = _wrapped()
    a = torch.randn(128, 64, device=DEV, requires_grad=True)
    b = torch.randn(128, 64, device=DEV)
    assert not add(a, b).requires_grad           # eager: no history, as TorchNeuron's
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: (add(a, b) + a).sum(), backend="neuron")
    with pytest.raises(RuntimeError, match=r"wrap_nki\(add_kernel\) in torch.compile: a wrap_nki kernel call "
                                           r"has no gradient"):
        compiled(a, b)
    with torch.no_grad():                       # no gradient recorded: compiled as usual
        torch.testing.assert_close(compiled(a, b).cpu(), (a.cpu() + b.cpu() + a.cpu()).sum())
    torch.testing.assert_close(compiled(a.detach(), b).cpu(), (a.cpu() + b.cpu() + a.cpu()).sum())
