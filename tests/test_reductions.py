"""Reductions on `neuron` bit for bit the CPU's, at sizes that cross ATen's
parallel-split thresholds.

ATen's CPU reductions split their work over intra-op threads: a reduction to a
single element of at least GRAIN_SIZE (32768) inputs sums each thread's share
first and then the shares (TensorIterator's two-pass reduction), so its bits
depend on the thread count; other reductions split over output elements. The
device runs the same kernels on its executor threads, so those threads must
use the count the CPU uses for the same call. The sweep covers sizes around
the thresholds, the reduced dimension inner and outer, contiguous and
transposed inputs, keepdim, several dimensions at once, the same reductions
closing a fused element-wise chain, and the sums autograd does (broadcast
gradients, the bias gradients of nn.Linear and nn.RNN). The last tests check
the executor's thread count against the host's, including after
torch.set_num_threads, in a fresh interpreter."""
import json
import math

import pytest
import torch
import torch.nn as nn

import torchneuron
from neuron_testing import SEED, run_python

GRAIN = 32768

# (shape, reduced dims) pairs: None reduces everything; a 1-D size, or a
# reduction to one element, over GRAIN takes the two-pass reduction.
SHAPES = [
    ((GRAIN - 1,), None),
    ((GRAIN,), None),
    ((GRAIN + 1,), 0),
    ((2 * GRAIN + 1,), None),
    (((1 << 20) + 7,), None),
    ((1, 2 * GRAIN + 1), 1),     # one output element, reduced dim inner
    ((2 * GRAIN + 1, 1), 0),     # one output element, reduced dim outer
    ((2, GRAIN + 3), 1),         # two long rows: one per thread
    ((3, 40000), 0),             # few outputs, long outer reduction
    ((40000, 3), 0),
    ((40000, 3), 1),
    ((1025, 1024), 0),
    ((1025, 1024), 1),
    ((1025, 1024), None),
    ((8, 70, 130), (0, 2)),      # several dims
    ((8, 70, 130), (0, 1)),
    ((2, 3, 1 << 16), (0, 1, 2)),
]
LAYOUTS = ["contiguous", "transposed"]
FLOATS = [torch.float32, torch.float64, torch.bfloat16]


def _input(shape, dtype, layout, kind="normal"):
    """Values of `shape` made on the CPU; "transposed" lays the last two dims
    out swapped (a 1-D input is a stride-2 slice instead)."""
    g = torch.Generator().manual_seed(SEED + sum(shape))
    if layout == "contiguous":
        base_shape = shape
    elif len(shape) == 1:
        base_shape = (2 * shape[0],)
    else:
        base_shape = (*shape[:-2], shape[-1], shape[-2])
    if dtype == torch.int64:
        lo, hi = (-1000, 1000) if kind == "normal" else (-2, 3)
        x = torch.randint(lo, hi, base_shape, generator=g)
    else:
        x = torch.randn(base_shape, generator=g, dtype=torch.float64)
        if kind == "near_one":  # products that stay finite
            x = torch.exp(x * (0.5 / math.sqrt(x.numel())))
        x = x.to(dtype)
    if layout == "contiguous":
        return x
    return x[::2] if len(shape) == 1 else x.transpose(-1, -2)


def _strides(t):
    """Strides of the dims longer than 1 (the only ones that locate an element);
    test_log_softmax_strides_of_a_size_one_dim_match_cpu checks the others."""
    return tuple(s for n, s in zip(t.shape, t.stride()) if n > 1)


def _bits_equal(name, got, want):
    """Equal bit for bit (NaN payloads and signed zeros included), with the
    CPU's dtype, shape and strides."""
    got = got.cpu()
    assert (got.dtype, got.shape) == (want.dtype, want.shape), name
    assert _strides(got) == _strides(want), f"{name}: strides {got.stride()} != {want.stride()}"
    if got.is_floating_point():
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
        got, want = got.contiguous().view(bits), want.contiguous().view(bits)
    differ = (got != want).sum().item()
    assert differ == 0, f"{name}: {differ} of {got.numel()} elements differ"


def _to_neuron(x):
    """x on `neuron` with x's strides (Tensor.to makes a strided view contiguous)."""
    if x._base is None:
        return x.to("neuron")
    return x._base.to("neuron").as_strided(x.size(), x.stride(), x.storage_offset())


def _compare(name, fn, *inputs):
    want = fn(*inputs)
    got = fn(*[_to_neuron(x) for x in inputs])
    want = want if isinstance(want, (tuple, list)) else (want,)
    got = got if isinstance(got, (tuple, list)) else (got,)
    for i, (a, b) in enumerate(zip(got, want)):
        _bits_equal(f"{name}[{i}]", a, b)


def _all_dims(x, dims):
    return tuple(range(x.dim())) if dims is None else dims


def _one_dim(dims):
    """The single dim an operator that takes one reduces over, or None."""
    if dims is None or isinstance(dims, int):
        return dims
    return dims[0] if len(dims) == 1 else "skip"


def _ops(dims, keepdim):
    """Reductions of a float input over `dims`: name -> function."""
    d = dims
    one = _one_dim(dims)
    ops = {
        "sum": lambda x: x.sum() if d is None else x.sum(d, keepdim=keepdim),
        "mean": lambda x: x.mean() if d is None else x.mean(d, keepdim=keepdim),
        "amax": lambda x: x.amax(_all_dims(x, d), keepdim=keepdim),
        "amin": lambda x: x.amin(_all_dims(x, d), keepdim=keepdim),
        "vector_norm_2": lambda x: torch.linalg.vector_norm(x, 2, d, keepdim),
        "vector_norm_1": lambda x: torch.linalg.vector_norm(x, 1, d, keepdim),
        "vector_norm_inf": lambda x: torch.linalg.vector_norm(x, math.inf, d, keepdim),
        "vector_norm_3": lambda x: torch.linalg.vector_norm(x, 3, d, keepdim),
        "var": lambda x: torch.var(x, d, keepdim=keepdim),
        "std_correction0": lambda x: torch.std(x, d, correction=0, keepdim=keepdim),
        "var_mean": lambda x: torch.var_mean(x, d, keepdim=keepdim),
        "logsumexp": lambda x: torch.logsumexp(x, _all_dims(x, d), keepdim=keepdim),
        "sum_float64": lambda x: x.sum(_all_dims(x, d), keepdim=keepdim, dtype=torch.float64),
    }
    if one != "skip":
        ops["norm"] = lambda x: x.norm() if one is None else x.norm(dim=one, keepdim=keepdim)
        ops["argmax"] = lambda x: x.argmax(one, keepdim=keepdim if one is not None else False)
        ops["argmin"] = lambda x: x.argmin(one, keepdim=keepdim if one is not None else False)
    if one not in ("skip", None):
        ops["max_dim"] = lambda x: torch.max(x, one, keepdim=keepdim)
        ops["min_dim"] = lambda x: torch.min(x, one, keepdim=keepdim)
        ops["cumsum"] = lambda x: torch.cumsum(x, one)
        ops["softmax"] = lambda x: torch.softmax(x, one)
        ops["log_softmax"] = lambda x: torch.log_softmax(x, one)
    return ops


def _prod(dims, keepdim):
    one = _one_dim(dims)
    if one == "skip":
        return None
    return lambda x: x.prod() if one is None else x.prod(one, keepdim=keepdim)


def _cases():
    for shape, dims in SHAPES:
        for layout in LAYOUTS:
            yield pytest.param(shape, dims, layout, id=f"{'x'.join(map(str, shape))}-dims{dims}-{layout}")


@pytest.mark.parametrize("shape,dims,layout", list(_cases()))
def test_reductions_match_cpu_bitwise(shape, dims, layout):
    for dtype in FLOATS:
        x = _input(shape, dtype, layout)
        for keepdim in ((False, True) if dims is not None else (False,)):
            for name, fn in _ops(dims, keepdim).items():
                _compare(f"{name} {dtype} keepdim={keepdim}", fn, x)
            prod = _prod(dims, keepdim)
            if prod is not None:
                _compare(f"prod {dtype} keepdim={keepdim}", prod, _input(shape, dtype, layout, "near_one"))
    for kind in ("normal", "small"):
        x = _input(shape, torch.int64, layout, kind)
        _compare(f"int64 sum {kind}", lambda t: t.sum() if dims is None else t.sum(dims), x)
        prod = _prod(dims, False)
        if prod is not None:
            _compare(f"int64 prod {kind}", prod, x)


def test_log_softmax_strides_of_a_size_one_dim_match_cpu():
    """PyTorch's Python meta of _log_softmax lays the result out like the input, the CPU kernel
    row-major: the first call of the signature teaches the executor the CPU's layout."""
    x = _input((1, 1000), torch.float32, "transposed")  # strides (1, 1)
    want = torch.log_softmax(x, 1)
    for _ in range(2):  # the first call of its signature, then a queued one
        assert torch.log_softmax(_to_neuron(x), 1).stride() == want.stride()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int16,
                                   torch.uint8, torch.bool])
def test_mode_values_and_indices_match_cpu_bitwise(dtype):
    """torch.mode, functional and out= (ATen's out= composite refuses devices
    other than the CPU, CUDA and XPU): values and indices among ties the
    CPU's, into fresh and into strided outputs, every dim, keepdim, empty and
    0-dim inputs; a wrong out= dtype raises the CPU's error at the call."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randint(0, 4, (6, 9, 5), generator=g).to(dtype)  # many ties
    for t in (x, x.transpose(0, 2), x[:, ::2], torch.tensor(3).to(dtype), torch.empty(0, 4, dtype=dtype)):
        for dim in range(-max(t.dim(), 1), max(t.dim(), 1)):
            if t.numel() == 0 and t.size(dim) == 0:
                continue
            for keepdim in (False, True):
                want = torch.mode(t, dim, keepdim)
                got = torch.mode(_to_neuron(t), dim, keepdim)
                for a, b in zip(got, want):
                    assert a.dtype == b.dtype and a.stride() == b.stride() and torch.equal(a.cpu(), b)
                outs = {d: (torch.zeros(3, *want[0].shape, dtype=dtype, device=d).select(0, 1),
                            torch.zeros(*want[1].shape, 2, dtype=torch.int64, device=d).select(-1, 0))
                        for d in ("cpu", "neuron")}
                torch.mode(t, dim, keepdim, out=outs["cpu"])
                torch.mode(_to_neuron(t), dim, keepdim, out=outs["neuron"])
                for a, b in zip(outs["neuron"], outs["cpu"]):
                    assert a.stride() == b.stride() and torch.equal(a.cpu(), b)

    def wrong_dtype(device):
        try:
            torch.mode(x.to(device), 1, out=(torch.empty(0, dtype=torch.complex64, device=device),
                                             torch.empty(0, dtype=torch.int64, device=device)))
        except RuntimeError as e:
            return str(e)

    assert wrong_dtype("neuron") == wrong_dtype("cpu") is not None
    torch.neuron.synchronize()
    assert torch.neuron.device_errors()["total"] == 0


# Reductions closing a fused element-wise chain (docs/adaptive_eager.md): a
# row-wise operator over the last dim, behind busy device work.
FUSED_SHAPES = [(2, 1 << 16), (3, 1 << 16), (1, 1 << 17), (64, 1537), (1 << 17, 1)]
FUSED_OPS = {
    "sum": lambda y: y.sum(-1),
    "mean": lambda y: y.mean(-1, keepdim=True),
    "amax": lambda y: y.amax(-1),
    "amin": lambda y: y.amin(-1),
    "softmax": lambda y: torch.softmax(y, -1),
    "log_softmax": lambda y: torch.log_softmax(y, -1),
    "layer_norm": lambda y: nn.functional.layer_norm(y, y.shape[-1:]),
    "sum_all": lambda y: y.sum(),
}


@pytest.fixture
def small_groups_fuse():
    default = torchneuron._C._min_fusable_numel()
    torchneuron._C._set_min_fusable_numel(GRAIN)
    yield
    torchneuron._C._set_min_fusable_numel(default)


def _busy():
    a = torch.ones(384, 384, device="neuron")
    for _ in range(2):
        a = a @ a / 384


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reductions_closing_a_fused_chain_match_cpu_bitwise(small_groups_fuse, dtype):
    torchneuron.clear_op_tracking()
    for shape in FUSED_SHAPES:
        x = _input(shape, dtype, "contiguous")
        b = _input(shape[-1:], dtype, "contiguous")
        for name, op in FUSED_OPS.items():
            def program(x, b):
                return op((x * 1.5 + b).relu() - 0.25)
            want = program(x, b)
            xn, bn = x.to("neuron"), b.to("neuron")
            _busy()
            _bits_equal(f"{name} {shape} {dtype}", program(xn, bn), want)
    assert torchneuron._C._fused_groups() > 0, "no chain fused: the test did not exercise fusion"


# The sums autograd does: gradients of broadcast operands (sum_to_size), and
# the bias gradients of nn.Linear and nn.RNN.
BROADCASTS = [((GRAIN + 5, 3), (3,)), ((3, GRAIN + 5), (3, 1)), ((2 * GRAIN + 1,), (1,)),
              ((16, 64, 96), (1, 64, 1)), ((16, 64, 96), (96,)), ((1025, 1024), (1, 1))]


@pytest.mark.parametrize("dtype", FLOATS)
def test_sum_to_size_and_broadcast_gradients_match_cpu_bitwise(dtype):
    for big, small in BROADCASTS:
        x = _input(big, dtype, "contiguous")
        _compare(f"sum_to_size {big}->{small}", lambda t: t.sum_to_size(small), x)
        b = _input(small, dtype, "contiguous")
        grad_out = _input(big, dtype, "transposed" if len(big) > 1 else "contiguous")

        def grads(x, b, grad_out):
            x, b = x.detach().requires_grad_(), b.detach().requires_grad_()
            torch.autograd.backward(x * b + b, grad_out)
            return x.grad, b.grad
        _compare(f"broadcast gradient {big} * {small}", grads, x, b, grad_out)


def _module_grads(make, device, inputs, dtype):
    torch.manual_seed(SEED)
    module = make().to(device=device, dtype=dtype)
    x, grad_out = (t if device == "cpu" else _to_neuron(t) for t in inputs)
    out = module(x.requires_grad_())
    out = out[0] if isinstance(out, tuple) else out
    out.backward(grad_out)
    return [out.detach().cpu(), x.grad.cpu()] + [p.grad.cpu() for p in module.parameters()]


def _check_module(make, batch, time, features, out_features, dtype, only=None):
    inputs = (_input((batch, time, features), dtype, "contiguous"),
              _input((batch, time, out_features), dtype, "transposed"))
    names = ["output", "input.grad"] + [n + ".grad" for n, _ in make().named_parameters()]
    got = _module_grads(make, "neuron", inputs, dtype)
    want = _module_grads(make, "cpu", inputs, dtype)
    for name, a, b in zip(names, got, want):
        if only is None or name in only:
            _bits_equal(f"{name} {dtype}", a, b)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("batch,time", [(64, 512), (32, 1025), (1, 40000)])
def test_linear_bias_gradient_over_batch_and_time_matches_cpu_bitwise(batch, time, dtype):
    _check_module(lambda: nn.Linear(8, 4), batch, time, 8, 4, dtype)


# nn.RNN of both nonlinearities, float32 tanh included (the CPU's on both sides).
RNN_CASES = [pytest.param(torch.float32, "relu", id="float32-relu"),
             pytest.param(torch.float32, "tanh", id="float32-tanh"),
             pytest.param(torch.float64, "tanh", id="float64-tanh")]
RNN_INPUT_PROJECTION = ("weight_ih_l0.grad", "bias_ih_l0.grad", "weight_ih_l1.grad", "bias_ih_l1.grad")


def _check_rnn(dtype, nonlinearity, names):
    _check_module(lambda: nn.RNN(8, 16, num_layers=2, batch_first=True, nonlinearity=nonlinearity),
                  32, 64, 8, 16, dtype, only=names)


@pytest.mark.parametrize("dtype,nonlinearity", RNN_CASES)
def test_rnn_output_and_recurrent_gradients_match_cpu_bitwise(dtype, nonlinearity):
    names = ["output", "input.grad"] + [f"{w}_hh_l{layer}.grad" for w in ("weight", "bias") for layer in (0, 1)]
    _check_rnn(dtype, nonlinearity, names)


@pytest.mark.parametrize("dtype,nonlinearity", RNN_CASES)
def test_rnn_input_projection_gradients_match_cpu_bitwise(dtype, nonlinearity):
    _check_rnn(dtype, nonlinearity, RNN_INPUT_PROJECTION)


# The executor's intra-op thread count, in a fresh interpreter: torch sets it
# per thread, so the probe changes it without touching this process's threads.
_THREADS_PROBE = """
import json, torch, torchneuron
from torchneuron import _python_tasks

def on_worker():
    seen = {}
    _python_tasks.launch("threads", [torch.zeros(1, device="neuron")],
                         lambda _: seen.update(n=torch.get_num_threads()))
    torch.neuron.synchronize()
    return seen["n"]

def bits(t):
    return t.cpu().view(torch.int32)

# [host's count, executor's count, a two-pass sum matches the CPU, the same
# sum as a backward (a broadcast gradient) matches the CPU]
def phase():
    x = torch.randn(4 * 32768 + 1, generator=torch.Generator().manual_seed(0))
    sums = [bits(x.sum()), bits(x.to("neuron").sum())]
    grads = []
    for device in ("cpu", "neuron"):
        scale = torch.ones(1, device=device, requires_grad=True)
        (x.to(device) * scale).sum().backward()   # scale.grad sums x on autograd's thread
        grads.append(bits(scale.grad))
    return [torch.get_num_threads(), on_worker(), bool(torch.equal(*sums)), bool(torch.equal(*grads))]

start = torch.get_num_threads()
other = 1 if start != 1 else 2
out = {"start": phase()}
torch.set_num_threads(other)
out["after_set"] = phase()
torch.set_num_threads(start)
stream = torch.neuron.Stream()
torch.set_num_threads(other)
with torch.neuron.stream(stream):
    on_worker()                  # its executor starts while the count is `other`
torch.set_num_threads(start)
with torch.neuron.stream(stream):
    out["new_stream"] = phase()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def thread_counts():
    """phase() of the probe, per phase."""
    proc = run_python(_THREADS_PROBE)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_executor_uses_the_hosts_thread_count(thread_counts):
    host, worker, sum_matched, backward_matched = thread_counts["start"]
    assert worker == host and sum_matched and backward_matched


def test_executor_follows_set_num_threads(thread_counts):
    host, worker, sum_matched, _ = thread_counts["after_set"]
    assert worker == host and sum_matched


def test_backward_after_set_num_threads_matches_cpu(thread_counts):
    """Autograd runs a neuron graph on its own device thread, whose count was
    fixed when it started; a CPU graph runs on the thread calling backward."""
    assert thread_counts["after_set"][3]


def test_an_executor_started_under_another_count_follows_the_host(thread_counts):
    host, worker, sum_matched, backward_matched = thread_counts["new_stream"]
    assert worker == host and sum_matched and backward_matched
