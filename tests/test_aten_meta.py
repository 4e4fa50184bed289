"""The meta pass calls ATen's C++ meta kernels (csrc/bridge/exec/aten_meta.h)
for the operators whose Meta dispatch PyTorch hands to Python references:
a new shape signature then runs no Python, and predicts the layout and the
checks of the CPU kernel the task runs."""
import sys

import pytest
import torch

import torchneuron

DEV = "neuron"
PYTHON_META = ("_refs", "_prims", "_prims_common", "_meta_registrations.py", "_decomp")


def meta_line(name: str) -> str:
    return next(line for line in torch._C._dispatch_dump(name).splitlines() if line.startswith("Meta:"))


def test_each_listed_operator_has_a_python_meta_kernel():
    # The list is worth keeping only while PyTorch overrides these: an entry
    # it no longer overrides (or an operator renamed) fails here.
    names = torchneuron._C._aten_meta_operators()
    assert len(names) > 50
    not_python = [n for n in names if "_meta_registrations.py" not in meta_line(n)]
    assert not not_python, f"Meta kernels no longer Python (drop them from aten_meta.cpp): {not_python}"


def python_meta_calls(fn):
    """Calls of Python functions in torch's meta modules while fn runs."""
    seen = []

    def hook(frame, event, arg):
        if event == "call" and any(f"torch/{m}" in frame.f_code.co_filename for m in PYTHON_META):
            seen.append(f"{frame.f_code.co_filename.split('torch/')[-1]}:{frame.f_code.co_name}")

    sys.setprofile(hook)
    try:
        out = fn()
    finally:
        sys.setprofile(None)
    return out, seen


def t(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=g, dtype=dtype)
    return torch.randint(-5, 5, shape, generator=g, dtype=dtype)


# Shapes seen nowhere else in the suite, so the meta cache misses.
CASES = [
    ("add, alpha, broadcast", lambda x, y: torch.add(x, y, alpha=3), (t(7, 13), t(13, seed=1))),
    ("sub of a transposed input", lambda x, y: x.t() - y, (t(11, 6), t(6, 11, seed=1))),
    ("div, floor mode", lambda x, y: torch.div(x, y, rounding_mode="floor"), (t(5, 9), t(5, 9, seed=1) + 3)),
    ("pow, scalar exponent", lambda x: x.pow(3), (t(4, 17),)),
    ("comparison with a scalar", lambda x: x > 0.25, (t(19, 3),)),
    ("isin", lambda x, y: torch.isin(x, y), (t(23, dtype=torch.int64), t(5, dtype=torch.int64, seed=1))),
    ("clamp", lambda x: x.clamp(-0.5, 0.5), (t(3, 29),)),
    ("cat of 4-d tensors", lambda x, y: torch.cat([x, y], 2), (t(1, 2, 3, 4), t(1, 2, 5, 4, seed=1))),
    ("cat promoting its dtype", lambda x, y: torch.cat([x, y]), (t(2, 5), t(3, 5, dtype=torch.float64))),
    ("cumsum", lambda x: x.cumsum(0), (t(31, 2),)),
    ("sum over a dim, keepdim", lambda x: x.sum(1, keepdim=True), (t(9, 37),)),
    ("mean over two dims", lambda x: x.mean((0, 2)), (t(3, 4, 41),)),
    ("softmax backward", lambda g, y: torch.ops.aten._softmax_backward_data(g, y, 1, torch.float32),
     (t(43, 6), torch.softmax(t(43, 6, seed=1), 1))),
    ("gelu backward", lambda g, x: torch.ops.aten.gelu_backward(g, x), (t(47, 2), t(47, 2, seed=1))),
    ("addmm", lambda b, x, y: torch.addmm(b, x, y, beta=0.5), (t(53), t(3, 59), t(59, 53, seed=1))),
    ("in-place add of a broadcast operand", lambda x, y: x.add_(y), (t(61, 4), t(4, seed=1))),
]


@pytest.mark.parametrize("name,fn,args", CASES, ids=[c[0] for c in CASES])
def test_new_shapes_run_no_python_meta_kernel_and_match_the_cpu(name, fn, args):
    want = fn(*[a.clone() for a in args])
    got, calls = python_meta_calls(lambda: fn(*[a.to(DEV) for a in args]))
    assert not calls, f"{name}: the meta pass ran Python: {calls[:5]}"
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(got.cpu(), want)


def test_a_call_its_meta_kernel_refuses_raises_the_cpus_error_at_the_call():
    # ATen's meta function makes the CPU kernel's checks: an in-place add
    # whose broadcast shape is not self's.
    x, y = torch.ones(3), torch.ones(4, 3)
    with pytest.raises(RuntimeError) as cpu:
        x.add_(y)
    with pytest.raises(RuntimeError) as dev:
        x.to(DEV).add_(y.to(DEV))
    assert str(dev.value) == str(cpu.value)
