"""Fused element-wise DAGs: operands reused, residual adds, values read by
later members other than the next one (csrc/bridge/kernels/exact_arithmetic.h,
`Held`); and groups over rows of any length (csrc/bridge/fusion/cost_model.h).
Fused on neuron, unfused on neuron and the CPU give the same bits, NaN
payloads, infinities and signed zeros included."""
import pytest
import torch

import torchneuron
from neuron_testing import queue_busy_work, raw_bits

N = 3 * 32768 + 77  # each thread's range ends in a scalar tail; large enough to fuse


def _inputs(dtype):
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(N, generator=g, dtype=dtype) for _ in range(3))
    at = torch.randint(N, (96,), generator=g)
    x[at[:16]], x[at[16:32]], x[at[32:48]], x[at[48:64]] = float("inf"), float("-inf"), -0.0, float("nan")
    w[at[40:56]] = float("nan")  # two NaN operands in some elements: ATen's payload rule
    if dtype == torch.float32:
        x.view(torch.int32)[at[64:80]] = 0x7FC12345
        w.view(torch.int32)[at[72:96]] = -0x3ABCDF
    return x, w, b


DAGS = {
    # The issue's: x read four times, a residual add, sigmoid and tanh.
    "reused_four_times": lambda x, w, b: torch.tanh(((x * 1.5 + 0.25).relu() * x).sigmoid() + x * 0.5) * 2 - x,
    "residual": lambda x, w, b: x + ((x * w).relu() - b) * 0.5,
    "both_operands_earlier": lambda x, w, b: (x * x + x) / (x.abs() + 1) - (x * w) * (x - b),
    "in_place": lambda x, w, b: (lambda a: (a.add_(x), a.mul_(a), a - x * 3)[-1])(x * 2),
    "kept_and_dropped": lambda x, w, b: (lambda t: (t, (t + w) * t - x))(x * w - b),
}


def _flat(result):
    return list(result) if isinstance(result, tuple) else [result]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", DAGS)
def test_dag_fused_equals_unfused_and_cpu_bitwise(name, dtype):
    dag = DAGS[name]
    cpu = _inputs(dtype)
    dev = [t.to("neuron") for t in cpu]
    dag(*dev)  # the first call of each signature runs on its own
    torch.neuron.synchronize()
    torchneuron.clear_op_tracking()
    queue_busy_work(repeats=4)
    fused = _flat(dag(*dev))
    torch.neuron.synchronize()
    assert torchneuron._C._fused_groups() >= 1, "the DAG did not fuse"
    torchneuron._C._set_adaptive_eager(False)
    try:
        unfused = _flat(dag(*dev))
    finally:
        torchneuron._C._set_adaptive_eager(True)
    for f, u, c in zip(fused, unfused, _flat(dag(*cpu))):
        assert f.stride() == c.stride()
        assert torch.equal(raw_bits(f), raw_bits(u)), f"{name}: fused differs from unfused"
        assert torch.equal(raw_bits(f), raw_bits(c)), f"{name}: fused differs from the CPU"


@pytest.mark.parametrize("rows", [640, 8192], ids=["one_piece_per_thread", "pieces_whole_fallback"])
def test_rows_of_any_length_fuse_bitwise(rows):
    """A broadcast bias and a row-wise softmax over rows of 100 elements (not
    a multiple of every vector step): one piece per thread when the working
    set stays in cache, else member by member over everything."""
    g = torch.Generator().manual_seed(2)
    x, b = torch.randn(rows, 100, generator=g), torch.randn(100, generator=g)
    program = lambda x, b: torch.softmax(x * 1.5 + b, -1) - 0.5
    dx, db = x.to("neuron"), b.to("neuron")
    program(dx, db)
    torch.neuron.synchronize()
    torchneuron.clear_op_tracking()
    queue_busy_work(repeats=4)
    fused = program(dx, db)
    torch.neuron.synchronize()
    assert torchneuron._C._fused_groups() >= 1
    torchneuron._C._set_adaptive_eager(False)
    try:
        unfused = program(dx, db)
    finally:
        torchneuron._C._set_adaptive_eager(True)
    assert torch.equal(raw_bits(fused), raw_bits(unfused))
    assert torch.equal(raw_bits(fused), raw_bits(program(x, b)))
