"""Results take the CPU's memory layout: the same strides for non-contiguous
inputs (transposed, channels_last, sliced), also where the result is an out=
argument that the call grows from empty, and so the same behaviour of later
views, `.contiguous()` and in-place updates."""
import pytest
import torch

DEV = "neuron"

LAYOUTS = {
    "transposed": lambda: torch.randn(6, 5).t(),
    "channels_last": lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
    "sliced": lambda: torch.randn(6, 10)[:, ::2],
    "permuted": lambda: torch.randn(3, 4, 5).permute(2, 0, 1),
}

UNARY = {
    "abs": torch.abs, "neg": torch.neg, "sin": torch.sin, "exp": torch.exp, "sigmoid": torch.sigmoid,
    "logical_not": torch.logical_not, "sign": torch.sign, "relu": torch.relu, "clone": torch.clone,
    "mul 2": lambda t: t * 2, "add self": lambda t: t + t, "logical_and": lambda t: torch.logical_and(t, t),
    "copysign": lambda t: torch.copysign(t, t), "xlogy": lambda t: torch.xlogy(t.abs(), t.abs()),
    "heaviside": lambda t: torch.heaviside(t, t), "ldexp": lambda t: torch.ldexp(t, torch.ones_like(t)),
    "where": lambda t: torch.where(t > 0, t, -t), "to bf16": lambda t: t.to(torch.bfloat16),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op", UNARY)
def test_results_keep_the_cpus_strides(op, layout):
    x = LAYOUTS[layout]()
    for _ in range(2):  # the first call of a signature, and a later one
        want = UNARY[op](x)
        got = UNARY[op](x.to(DEV))
        assert got.stride() == want.stride()
        assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op", ["abs", "sin", "neg", "exp"])
def test_an_empty_out_grows_with_the_cpus_strides(op, layout):
    x = LAYOUTS[layout]()
    f = getattr(torch, op)
    for _ in range(2):
        want, got = torch.empty(0), torch.empty(0, device=DEV)
        f(x, out=want)
        f(x.to(DEV), out=got)
        assert got.stride() == want.stride()
        assert torch.equal(got.cpu(), want)


def test_later_views_and_contiguous_behave_as_on_the_cpu():
    x = torch.randn(8, 8).t()
    assert x.abs().t().view(64).shape == x.to(DEV).abs().t().view(64).shape
    y = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    assert y.to(DEV).abs().is_contiguous(memory_format=torch.channels_last)
    for dev in ("cpu", DEV):  # contiguous() of a result returns it, so an update reaches the result
        r = x.to(dev).abs().t()
        c = r.contiguous()
        c.add_(1)
        assert torch.equal(r.cpu(), c.cpu())
