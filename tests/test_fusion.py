"""Adaptive eager execution: fusion of queued element-wise work (1500 fuzzed programs).

The fuzzer runs random element-wise programs with fusion on, with fusion off,
and on the CPU: on and off must agree bit for bit, and the CPU within
PyTorch's default tolerances. Other tests show that fusion happens on typical chains and not
where it must not."""
import os
import random

import pytest
import torch

import torchneuron
from neuron_testing import FusableFrom, queue_busy_work, raw_bits

N = 256  # programs work on N x N tensors, made large enough to fuse below


@pytest.fixture(autouse=True, scope="module")
def small_tensors_fuse():
    with FusableFrom(1 << 15):
        yield


@pytest.fixture
def fusion():
    yield lambda on: torchneuron._C._set_adaptive_eager(on)
    torchneuron._C._set_adaptive_eager(True)


_busy = queue_busy_work


UNARY = [torch.relu, torch.sigmoid, torch.tanh, torch.neg, torch.abs, torch.nn.functional.gelu,
         torch.nn.functional.silu, torch.square, lambda x: torch.exp(x.clamp(-5, 5)), lambda x: torch.sqrt(x.abs()), torch.reciprocal, torch.sqrt]
BINARY = [torch.add, torch.sub, torch.mul, lambda a, b: a / (b.abs() + 1), torch.maximum, torch.minimum,
          lambda a, b: torch.where(a > b, a, b), lambda a, b: a.lerp(b, 0.3)]
SCALAR = [lambda x: x + 0.5, lambda x: x * 1.5, lambda x: 2.0 - x, lambda x: x.clamp(-1, 1), lambda x: x / 3.0,
          lambda x: x - 0.25, lambda x: x.clamp_min(0.1), lambda x: x.clamp(max=0.2), lambda x: torch.add(x, 1, alpha=3)]
CAST = [lambda x: x.to(torch.bfloat16).to(x.dtype), lambda x: (x.double() * 3).to(x.dtype), lambda x: x.half().to(x.dtype)]
F = torch.nn.functional
ROW_WISE = [lambda x: torch.softmax(x, -1), lambda x: F.log_softmax(x, dim=-1), lambda x: F.layer_norm(x, x.shape[-1:]),
            lambda x: x - x.mean(-1, keepdim=True), lambda x: x / (x.abs().sum(-1, keepdim=True) + 1),
            lambda x: x - x.amax(-1, keepdim=True), lambda x: x.sum(-1)[:, None] * x]
IN_PLACE = [lambda x, y: x.add_(y), lambda x, y: x.mul_(0.9), lambda x, y: x.addcmul_(y, y, value=0.1),
            lambda x, y: x.clamp_(-2, 2)]


def _program(seed):
    rng = random.Random(seed)
    dtype = rng.choice([torch.float32, torch.float32, torch.float64, torch.bfloat16, torch.float16])
    steps = [(rng.random(), rng.randrange(1000), rng.randrange(1000), rng.random(), rng.random())
             for _ in range(rng.randint(4, 10))]
    layout = rng.choice(["contiguous", "contiguous", "transposed", "strided", "column", "row", "odd_rows"])
    grad = dtype == torch.float32 and rng.random() < 0.3
    special = rng.random() < 0.3  # NaN (with a payload), infinities and signed zeros among the inputs

    def inputs(device):
        g = torch.Generator().manual_seed(seed)
        xs = [torch.randn(N, N, generator=g).to(dtype) for _ in range(3)]
        if layout == "transposed":
            xs[1] = xs[1].t()
        elif layout == "strided":
            xs[2] = torch.randn(N, 2 * N, generator=g).to(dtype)[:, ::2]
        elif layout == "column":  # one value per row (a row statistic)
            xs[2] = torch.randn(N, 1, generator=g).to(dtype)
        elif layout == "row":  # one row for all rows (a bias)
            xs[2] = torch.randn(N, generator=g).to(dtype)
        elif layout == "odd_rows":  # rows that do not split evenly over threads: fused, run member by member
            xs = [torch.randn(N + 1, N, generator=g).to(dtype) for _ in range(2)] + [torch.randn(N, generator=g).to(dtype)]
        if special:
            for x in xs:
                at = tuple(torch.randint(n, (64,), generator=g) for n in x.shape)
                part = lambda lo, hi: tuple(i[lo:hi] for i in at)
                x[part(0, 16)], x[part(16, 32)], x[part(32, 48)], x[part(48, 64)] = (
                    float("inf"), float("-inf"), -0.0, float("nan"))
                if dtype == torch.float32:  # a NaN with a payload of its own, and a negative one
                    x.view(torch.int32)[part(48, 56)] = 0x7FC12345
                    x.view(torch.int32)[part(56, 64)] = -0x3ABCDF  # 0xFFC54321
        out = [x.to(device) for x in xs]
        if grad:
            out = [x.detach().requires_grad_() for x in out]
        return out

    def run(xs):
        pool = [x * 1 for x in xs]  # work on copies: leaves stay untouched
        keep = []
        for kind, i, j, r, d in steps:
            a, b = pool[i % len(pool)], pool[j % len(pool)]
            if kind < 0.3:
                y = UNARY[i % len(UNARY)](a)
            elif kind < 0.65:
                y = BINARY[j % len(BINARY)](a, b)  # may broadcast
            elif kind < 0.74:
                y = SCALAR[i % len(SCALAR)](a)
            elif kind < 0.78:
                y = CAST[i % len(CAST)](a)
            elif kind < 0.85:
                y = ROW_WISE[i % len(ROW_WISE)](a if a.dim() == 2 else a + pool[0])
            elif not grad and a.shape == b.shape:
                y = IN_PLACE[j % len(IN_PLACE)](a, b)
            else:
                y = a * b if a.shape == b.shape else a + 1
            if r < 0.3:
                keep.append(y)  # the program still holds some intermediates
            pool.append(y)
            if d < 0.5:
                del pool[(i + j) % (len(pool) - 1)]  # and drops others: temporaries fusion never writes
        out = pool[-1].float().sum() + sum(k.float().sum() for k in keep)
        grads = torch.autograd.grad(out, xs, allow_unused=True, materialize_grads=True) if grad else ()
        return [pool[-1], *keep, *grads]

    return inputs, run


def _fused_and_unfused(fusion, program):
    """program() queued behind busy work with fusion on (op tracking cleared
    first, so it counts this run's groups), then with fusion off. More busy
    work than the fuzzer's: callers count groups, which a loaded machine
    would otherwise split. A first run beforehand: the first call of each
    signature runs on its own, synchronously (errors at the call)."""
    program()
    torchneuron.clear_op_tracking()
    _busy(repeats=6)
    fused = program()
    fusion(False)
    _busy()
    return fused, program()


def _bits_equal(a, b):
    """Equal bit for bit, NaN payloads and signed zeros included."""
    assert a.dtype == b.dtype and a.shape == b.shape
    a, b = raw_bits(a), raw_bits(b)
    assert torch.equal(a, b), f"{(a != b).sum()} of {a.numel()} elements differ"


def test_fuzz_fused_equals_unfused_bitwise_and_cpu(fusion):
    torchneuron.clear_op_tracking()
    programs = int(os.environ.get("TORCHNEURON_FUSION_PROGRAMS", "1500"))  # fewer: test_isa_paths.py's children
    for seed in range(programs):
        inputs, run = _program(seed)
        results = {}
        for on in (True, False):
            fusion(on)
            _busy()
            results[on] = [t.detach().cpu() for t in run(inputs("neuron"))]
        cpu = run(inputs("cpu"))
        for a, b, c in zip(results[True], results[False], cpu):
            _bits_equal(a, b)
            torch.testing.assert_close(a, c.detach(), equal_nan=True)
    assert torchneuron._C._fused_groups() > programs // 4, "the fuzzer hardly exercised fusion"
    assert torchneuron._C._elided_intermediates() > programs // 4, "the fuzzer hardly dropped a fused intermediate"


def test_fusion_happens_on_typical_chains(fusion):
    x = torch.randn(N, N, device="neuron")
    a, c = torch.randn_like(x), torch.randn_like(x)

    torchneuron.clear_op_tracking()
    _busy()
    elided = torchneuron._C._elided_intermediates()
    y = torch.nn.functional.gelu(x * a + c)  # GELU of an element-wise affine map
    assert torchneuron._C._fused_groups() == 1
    assert set(torchneuron._C.get_fused_ops()) == {"aten::mul.Tensor", "aten::add.Tensor", "aten::gelu"}
    assert torchneuron._C._elided_intermediates() - elided == 2  # x * a and the sum: temporaries, never written
    fusion(False)
    _busy()
    _bits_equal(y, torch.nn.functional.gelu(x * a + c))


def test_casts_fuse(fusion):
    x = torch.randn(N, N, device="neuron")
    torchneuron.clear_op_tracking()
    _busy()
    y = ((x * 2).to(torch.bfloat16) + 1).float() - 3
    assert torchneuron._C._fused_groups() == 1
    assert torchneuron._C.get_fused_ops()["aten::copy_"] == 2
    _bits_equal(y, ((x.cpu() * 2).to(torch.bfloat16) + 1).float() - 3)


def test_two_nan_operands_keep_atens_payload(fusion):
    """Float arithmetic runs in fusion's own loops (exact_arithmetic.h), except
    where both operands of an element are NaN: which payload survives differs
    between ATen's vector loop and its scalar tail, so ATen computes those."""
    n = 2 * 32768 + 17  # each thread's range ends in a scalar tail
    a, b = torch.randn(n), torch.randn(n)
    at = torch.tensor([0, 5, 1000, 32768 - 1, 32768 + 3, n // 2 - 1, n // 2, n // 2 + 1, n - 9, n - 2, n - 1])
    a.view(torch.int32)[at], b.view(torch.int32)[at] = 0x7FC12345, -0x3ABCDF  # 0xFFC54321
    a, b = a.to("neuron"), b.to("neuron")
    program = lambda: [(a * b).abs() - 1, (a + b) * 3, (b / a).neg() - a, a.clamp(-1, 1) * b,
                       (a + 0).mul_(b), (b - 0).div_(a) + 1, a * float("nan") - b]  # in place; a NaN Scalar
    _busy()
    fused = program()
    assert torchneuron._C._fused_groups() > 0
    fusion(False)
    _busy()
    for x, y in zip(fused, program()):
        _bits_equal(x, y)


@pytest.mark.parametrize("rows", [N, N + 1])  # N + 1: threads do not start on a row, members run in turn
def test_broadcast_operands_fuse(fusion, rows):
    x = torch.randn(rows, N, device="neuron")
    scale, bias = torch.randn(N, device="neuron"), torch.randn(1, N, device="neuron")
    row_max = x.amax(dim=-1, keepdim=True)

    def program():
        y = torch.nn.functional.silu(x * scale + bias)  # per-feature affine map (rows broadcast)
        return torch.exp(y - row_max) / 3  # against a row statistic (columns broadcast)

    fused, unfused = _fused_and_unfused(fusion, program)
    assert torchneuron._C._fused_groups() == 1
    assert sum(torchneuron.get_fused_ops().values()) == 6
    _bits_equal(fused, unfused)
    cpu = (x.cpu(), scale.cpu(), bias.cpu(), row_max.cpu())
    torch.testing.assert_close(fused.cpu(), torch.exp(torch.nn.functional.silu(cpu[0] * cpu[1] + cpu[2]) - cpu[3]) / 3)


def test_broadcast_of_trailing_dims_and_single_elements(fusion):
    x = torch.randn(4, 64, 128, device="neuron")
    pos = torch.randn(64, 128, device="neuron")  # a [T, D] row against [B, T, D]
    gain = torch.tensor([[1.5]], dtype=torch.float64, device="neuron")  # one element, rank 2, float64

    def program():
        return torch.relu((x + pos) * gain) - 0.5

    fused, unfused = _fused_and_unfused(fusion, program)
    assert torchneuron._C._fused_groups() == 1
    assert fused.dtype == unfused.dtype == torch.float64  # a rank-2 tensor keeps its weight in promotion
    _bits_equal(fused, unfused)


def test_single_element_of_rank_two_in_a_flat_group(fusion):
    """No member broadcasts a row, so pieces are flat; the single element keeps
    its rank (and its weight in promotion) all the same."""
    y = torch.randn(4, 64, 128, device="neuron")
    gain = torch.tensor([[1.5]], dtype=torch.float64, device="neuron")
    fused, unfused = _fused_and_unfused(fusion, lambda: torch.relu(y * gain) - 0.5)
    assert torchneuron._C._fused_groups() >= 1
    assert fused.dtype == torch.float64
    _bits_equal(fused, unfused)


def test_residual_add_and_layer_norm_fuse(fusion):
    x, h = torch.randn(2, N, N, device="neuron"), torch.randn(2, N, N, device="neuron")
    ln = torch.nn.LayerNorm(N, device="neuron")
    torch.nn.init.normal_(ln.weight)
    torch.nn.init.normal_(ln.bias)

    def program():
        with torch.no_grad():
            r = x + h * 0.5  # the residual stream: held, so written
            return r, ln(r)

    program()  # layer norm has three results: checked against its meta function once, synchronously
    fused, unfused = _fused_and_unfused(fusion, program)
    assert torchneuron._C._fused_groups() == 1
    assert set(torchneuron.get_fused_ops()) == {"aten::mul.Tensor", "aten::add.Tensor", "aten::native_layer_norm"}
    for a, b in zip(fused, unfused):
        _bits_equal(a, b)
    torch.testing.assert_close(fused[1].cpu(), ln.cpu()(x.cpu() + h.cpu() * 0.5))


def test_softmax_written_out_fuses_with_its_reductions(fusion):
    x = torch.randn(N, 2 * N, device="neuron")

    def program():
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    program()  # first calls take the host long enough (meta functions) for the device to catch up
    fused, unfused = _fused_and_unfused(fusion, program)
    assert torchneuron._C._fused_groups() == 1
    assert sum(torchneuron.get_fused_ops().values()) == 5
    _bits_equal(fused, unfused)
    torch.testing.assert_close(fused.cpu(), torch.softmax(x.cpu(), -1))


def test_adamw_for_loop_update_fuses_and_matches(fusion):
    def step(on):
        fusion(on)
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(N, N, device="neuron"))
        opt = torch.optim.AdamW([p], lr=1e-2, foreach=False)
        for _ in range(3):
            p.grad = torch.ones_like(p) * 0.1
            _busy()
            opt.step()
        return p.detach().cpu()

    torchneuron.clear_op_tracking()
    fused = step(True)
    assert torchneuron._C._fused_groups() >= 1
    _bits_equal(fused, step(False))


def test_no_fusion_across_a_read_or_overlapping_views(fusion):
    x = torch.randn(N * N + 1, device="neuron")
    torchneuron.clear_op_tracking()
    _busy()
    y = x[1:] * 2
    z = x[:-1] + y  # overlaps x[1:] at a shift: must not fuse with the mul
    assert torchneuron._C._fused_groups() == 0
    expected = x.cpu()[:-1] + x.cpu()[1:] * 2
    _bits_equal(z, expected)

    _busy()
    a = x[: N * N] * 3
    a.sum().item()  # a read ends the window
    b = a + 1
    assert torchneuron._C._fused_groups() == 0
    _bits_equal(b, x.cpu()[: N * N] * 3 + 1)


def test_deterministic_mode_turns_fusion_off():
    x = torch.randn(N, N, device="neuron")
    torchneuron.clear_op_tracking()
    torch.use_deterministic_algorithms(True)
    try:
        assert not torchneuron._C._adaptive_eager_enabled()
        _busy()
        (x * 2 + 1).relu()
    finally:
        torch.use_deterministic_algorithms(False)
    assert torchneuron._C._fused_groups() == 0


def test_error_in_fused_member_names_it(fusion):
    x = torch.randn(N, N, device="neuron")
    idx = torch.tensor([0, 10**6], device="neuron")
    # The kernel accepts a call of the same signature: later calls queue.
    torch.index_select(x.view(-1), 0, torch.tensor([0, 1], device="neuron"))
    _busy()
    y = x * 2 + 1
    bad = torch.index_select(y.view(-1), 0, idx)  # not element-wise: its own task
    with pytest.raises(IndexError, match="index_select"):
        bad.cpu()
    torch.neuron.reset_errors()


LIBRARY_FUNCTIONS = ["tanh", "exp", "log", "log2", "log10", "sqrt", "sin", "cos", "tan", "asin", "acos", "atan",
                     "erf", "erfc"]


@pytest.mark.parametrize("n, dtype", [(2 * 32768 + 21, torch.float32), (2 * 32768 + 21, torch.float64),
                                      (8 * 2**20 + 13, torch.float32)])
@pytest.mark.differs_under("stream_sanitizer", "the host's work per operator under it lets the device run each "
                                              "operator of the small case before the next is issued: none fuse")
def test_library_functions_and_streamed_results_match_unfused(fusion, n, dtype):
    """sigmoid, tanh, exp, log, ... run in fusion's own slices through the
    math-library calls ATen's kernels make (vector_math.h), including the
    scalar remainder where a thread's range ends mid-vector (n); results of
    32 MB and more are written with non-temporal stores unless the group
    reads them again (the held `h`)."""
    if dtype == torch.float32:  # this machine's ATen: MKL's VML; sigmoid at every ISA level (kernels/isa.h)
        assert all(torchneuron._C._fusion_computes_as_unfused(op, dtype) for op in LIBRARY_FUNCTIONS + ["sigmoid"])
        assert not torchneuron._C._fusion_computes_as_unfused("gelu", dtype)
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(n, generator=g, dtype=dtype) * 8, torch.randn(n, generator=g, dtype=dtype)
    at = torch.tensor([0, 7, 32768 - 1, n // 2 - 1, n // 2, n // 2 + 1, n - 21, n - 3, n - 1])
    a[at[:3]], a[at[3:6]], a[at[6:]] = float("nan"), float("-inf"), -0.0
    cpu = (a, b)
    a, b = a.to("neuron"), b.to("neuron")

    def program(a=a, b=b):
        h = torch.sigmoid(a * 1.5)  # held, and read again by the group
        y = torch.tanh(h - b) * b
        y = torch.exp(y) + torch.log(h) - torch.sin(y)
        return h, torch.atan(torch.sigmoid(y)) * torch.sqrt(h) + torch.erf(b)  # 16 members: a whole group

    program()  # first calls (meta functions, the check against ATen) take the host long enough for the device to catch up
    fused, unfused = _fused_and_unfused(fusion, program)
    assert torchneuron._C._fused_groups() >= 1
    for x, y, c in zip(fused, unfused, program(*cpu)):
        _bits_equal(x, y)
        _bits_equal(x, c)  # every function is the CPU's, float32 tanh included
