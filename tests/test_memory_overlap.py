"""Operands that share device memory, as on the CPU: an in-place operation,
out= call or copy whose output partially overlaps an input raises the CPU's
error at the call, and leaves the tensor as the CPU does; every other
sharing computes the CPU's values. Small and large (fusable) sizes."""
import pytest
import torch

DEV = "neuron"

PROGRAMS = {
    "x[1:] += x[:-1]": lambda x: x[1:].add_(x[:-1]),
    "x[1:] = x[:-1]": lambda x: x[1:].copy_(x[:-1]),
    "x[2:].copy_(x[:-2])": lambda x: x[2:].copy_(x[:-2]),
    "add(x[:-1], 1, out=x[1:])": lambda x: torch.add(x[:-1], 1, out=x[1:]),
    "exp(x[:-1], out=x[1:])": lambda x: torch.exp(x[:-1], out=x[1:]),
    "x[1:].mul_(x[:-1])": lambda x: x[1:].mul_(x[:-1]),
    "x[:-1].sub_(x[1:])": lambda x: x[:-1].sub_(x[1:]),
    "x[1:].addcmul_(x[:-1], x[:-1])": lambda x: x[1:].addcmul_(x[:-1], x[:-1]),
    "x[1:].clamp_(min=x[:-1])": lambda x: x[1:].clamp_(min=x[:-1]),
    "expanded output": lambda x: x[:1].expand(x.numel()).add_(1),
    # sharings the CPU accepts
    "x.add_(x)": lambda x: x.add_(x),
    "x[:n/2].add_(x[n/2:])": lambda x: x[: x.numel() // 2].add_(x[x.numel() // 2:]),
    "x[::2].mul_(x[1::2])": lambda x: x[::2].mul_(x[1::2]),
    "x.copy_(x.flip(0))": lambda x: x.copy_(x.flip(0)),
    "x[:].copy_(x)": lambda x: x[:].copy_(x),
    "x.view(2, -1)[0].add_(x.view(2, -1)[1])": lambda x: x.view(2, -1)[0].add_(x.view(2, -1)[1]),
    "x.add_(x.view(2, -1).t().reshape(-1))": lambda x: x.add_(x.view(2, -1).t().reshape(-1)),
}


def run(fn, device, n):
    x = torch.arange(float(n), device=device)
    try:
        fn(x)
        if device == DEV:
            torch.neuron.synchronize()
        return None, x.cpu()
    except Exception as e:  # noqa: BLE001 - the exception itself is compared
        return e, x.cpu()


@pytest.mark.parametrize("n", [8, 1 << 18], ids=["small", "fusable"])
@pytest.mark.parametrize("name", PROGRAMS)
def test_overlapping_operands_as_on_the_cpu(name, n):
    cpu_error, cpu_x = run(PROGRAMS[name], "cpu", n)
    dev_error, dev_x = run(PROGRAMS[name], DEV, n)
    assert type(dev_error) is type(cpu_error), (cpu_error, dev_error)
    if cpu_error is not None:
        assert str(dev_error).split("\n")[0] == str(cpu_error).split("\n")[0]
    assert torch.equal(dev_x, cpu_x)


def test_the_error_is_raised_at_the_call_behind_queued_work():
    a = torch.randn(512, 512, device=DEV)
    for _ in range(4):
        a = a @ a  # busy device
    x = torch.arange(8.0, device=DEV)
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        x[1:] += x[:-1]
    torch.neuron.synchronize()  # nothing deferred
    assert torch.equal(x.cpu(), torch.arange(8.0))


def test_an_expanded_result_is_computed_as_on_the_cpu():
    """A composite may return a broadcast view where the CPU caller gets the view itself:
    convolution's double backward returns the bias gradient's gradient expanded to the output's
    shape (stride 0). Its device memory takes the CPU's strides and each value once, on the
    first call (synchronous) and on later ones (queued); and ConvTranspose3d's second-order
    gradient through the bias, which needs it, is the CPU's."""
    g = torch.Generator().manual_seed(7)
    ggb, grad_out = torch.randn(5, generator=g, dtype=torch.float64), torch.randn(1, 5, 5, 6, 7, generator=g, dtype=torch.float64)
    weight, x = torch.randn(4, 5, 3, 3, 3, generator=g, dtype=torch.float64), torch.randn(1, 4, 3, 4, 5, generator=g, dtype=torch.float64)

    def double_backward(device):
        out = []
        for k in range(3):
            args = [t.to(device) * (k + 1) for t in (ggb, grad_out, weight, x)]
            r = torch.ops.aten._convolution_double_backward(None, None, *args, [1, 1, 1], [0, 0, 0], [1, 1, 1],
                                                            True, [0, 0, 0], 1, [True, True, True])
            out.append((r[0].stride(), r[0].cpu(), r[1], r[2]))
        return out

    for (s, v, w, i), (ds, dv, dw, di) in zip(double_backward("cpu"), double_backward(DEV)):
        assert ds == s == (5, 1, 0, 0, 0) and torch.equal(dv, v) and w is dw is i is di is None

    def second_order(device):
        torch.manual_seed(7)
        m = torch.nn.ConvTranspose3d(4, 5, 3).double().to(device)
        inp = x.to(device).requires_grad_()
        v = grad_out.to(device).requires_grad_()
        (gb,) = torch.autograd.grad(m(inp), m.bias, v, create_graph=True)
        (gv,) = torch.autograd.grad(gb, v, torch.arange(5.0, dtype=torch.float64, device=device))
        return gv.cpu()

    assert torch.equal(second_order(DEV), second_order("cpu"))
