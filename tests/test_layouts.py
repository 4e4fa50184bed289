"""Results take the CPU's memory layout: the same strides for non-contiguous
inputs (transposed, channels_last, sliced), also where the result is an out=
argument that the call grows from empty, and so the same behaviour of later
views, `.contiguous()` and in-place updates."""
import pytest
import torch

DEV = "neuron"

# Each layout is made on both devices from the same values, so that the
# device's operand has the CPU's strides (`x.to(DEV)` of a sliced view is
# contiguous, and some CPU kernels' bits depend on the layout: sigmoid of a
# sliced view and of its contiguous copy differ by an ulp on AVX2).
LAYOUTS = {
    "transposed": (lambda: torch.randn(6, 5), lambda t: t.t()),
    "channels_last": (lambda: torch.randn(2, 3, 4, 5), lambda t: t.to(memory_format=torch.channels_last)),
    "sliced": (lambda: torch.randn(6, 10), lambda t: t[:, ::2]),
    "permuted": (lambda: torch.randn(3, 4, 5), lambda t: t.permute(2, 0, 1)),
}


def on_both(layout):
    make, view = LAYOUTS[layout]
    base = make()
    x, y = view(base), view(base.to(DEV))
    assert x.stride() == y.stride()
    return x, y

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
    x, y = on_both(layout)
    for _ in range(2):  # the first call of a signature, and a later one
        want = UNARY[op](x)
        got = UNARY[op](y)
        assert got.stride() == want.stride()
        assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op", ["abs", "sin", "neg", "exp"])
def test_an_empty_out_grows_with_the_cpus_strides(op, layout):
    x, y = on_both(layout)
    f = getattr(torch, op)
    for _ in range(2):
        want, got = torch.empty(0), torch.empty(0, device=DEV)
        f(x, out=want)
        f(y, out=got)
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


@pytest.mark.parametrize("make, layout", [
    (lambda x: torch.quantize_per_tensor(x, 0.1, 0, torch.qint8), "quantized"),
    (lambda x: torch.quantize_per_channel(x.view(2, 2), torch.tensor([0.1, 0.2], device=x.device),
                                          torch.tensor([0, 0], device=x.device), 0, torch.quint8), "quantized"),
    (lambda x: x.to_sparse(), "sparse"),
    (lambda x: x.view(2, 2).to_sparse_csr(), "sparse"),
], ids=["quantize_per_tensor", "quantize_per_channel", "to_sparse", "to_sparse_csr"])
def test_quantized_and_sparse_results_are_refused_at_the_call(make, layout):
    """neuron tensors are dense: an operator that would return another layout
    raises at the call, naming the operator and the layout, instead of
    returning a dense tensor with wrong metadata."""
    with pytest.raises(NotImplementedError, match=f"returns a {layout} tensor"):
        make(torch.randn(4, device=DEV))
    assert make(torch.randn(4)).layout != torch.strided or make(torch.randn(4)).is_quantized  # the CPU has them


@pytest.mark.parametrize("make", [
    lambda: torch.randn(2, 3).to_sparse().to(DEV),
    lambda: torch.randn(2, 3).to_sparse().neuron(),
    lambda: torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.tensor([1.0, 2.0]), (3,), device=DEV),
    # Moving a compressed tensor calls no neuron kernel, so it is built; its operators refuse (those
    # with a composite kernel for every backend, such as mul, stop at TensorIterator's layout check).
    lambda: torch.randn(2, 3).to_sparse_csr().to(DEV).to_dense(),
    lambda: torch.randn(2, 3).to_sparse_csr().to(DEV).sum(),
], ids=["coo-to", "coo-neuron", "coo-factory", "csr-to_dense", "csr-sum"])
def test_a_sparse_tensor_on_neuron_is_refused_naming_the_operator(make):
    """Instead of the dispatcher's table of every backend the operator has."""
    with pytest.raises(NotImplementedError, match=r"neuron: aten::[\w.]+ was called with a sparse tensor on neuron, "
                                                 r"and neuron tensors are dense \(strided\) only") as e:
        make()
    assert "backend fallback" not in str(e.value)


@pytest.mark.parametrize("op", ["kthvalue", "median", "mode"])
def test_two_empty_outs_grow_apart(op):
    """Functionals that fill two empty out= tensors (values and indices) give
    both the CPU's values, at the first call of a signature too."""
    x = torch.randn(5, 6)
    f = {"kthvalue": lambda t: torch.kthvalue(t, 2, 0), "median": lambda t: torch.median(t, 1),
         "mode": lambda t: torch.mode(t, 0)}[op]
    for _ in range(2):
        want, got = f(x), f(x.to(DEV))
        assert torch.equal(got.values.cpu(), want.values) and torch.equal(got.indices.cpu(), want.indices)
