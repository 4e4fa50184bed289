"""Every normalisation layer's forward and backward on `neuron` against the
CPU for every memory format of its input: outputs, the input gradient as the
layer's backward produces it (before AccumulateGrad, which would restride it),
the leaf's gradient, parameter gradients and buffers, values bit for bit and
strides equal.

Autograd formulas that branch on the device are what this guards against: PyTorch's
derivative of native_group_norm made the gradient and input contiguous
everywhere but the CPU, so a channels-last GroupNorm got the contiguous
kernel's sums and lost its format (ops/group_norm_autograd.cpp).

Layouts: contiguous, channels_last / channels_last_3d, batch-major transposed
(dims 0 and 1 swapped in memory) and the last two dims swapped; the gradient
arrives in the input's layout, and also in the other of contiguous and
channels-last, so a gradient whose format differs from the input's is covered.
"""
import pytest
import torch
import torch.nn as nn

import torchneuron  # noqa: F401
from neuron_testing import SEED

DEV = "neuron"
C = 8


def modules(ndim):
    bn, inorm = (nn.BatchNorm2d, nn.InstanceNorm2d) if ndim == 4 else (nn.BatchNorm3d, nn.InstanceNorm3d)
    return {
        "batch_norm_train": (lambda: bn(C), True),
        "batch_norm_eval": (lambda: bn(C), False),
        "batch_norm_no_stats": (lambda: bn(C, track_running_stats=False), True),
        "instance_norm": (lambda: inorm(C, affine=True), True),
        "instance_norm_stats_eval": (lambda: inorm(C, affine=True, track_running_stats=True), False),
        "group_norm": (lambda: nn.GroupNorm(4, C), True),
        "group_norm_no_affine": (lambda: nn.GroupNorm(2, C, affine=False), True),
        "local_response_norm": (lambda: nn.LocalResponseNorm(3), True),
        "layer_norm": (lambda: nn.LayerNorm([5]), True),
        "layer_norm_2d": (lambda: nn.LayerNorm([4, 5]), True),
        "rms_norm": (lambda: nn.RMSNorm([5]), True),
        "rms_norm_2d": (lambda: nn.RMSNorm([4, 5]), True),
    }


def layouts(ndim):
    cl = torch.channels_last if ndim == 4 else torch.channels_last_3d
    return {
        "contiguous": lambda t: t.contiguous(),
        "channels_last": lambda t: t.contiguous(memory_format=cl),
        "transposed": lambda t: t.transpose(0, 1).contiguous().transpose(0, 1),
        "last_dims_swapped": lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2),
    }


def other_format(name):
    """The gradient's second layout: channels-last for a contiguous-like input, else contiguous."""
    return "channels_last" if name == "contiguous" else "contiguous"


def run(make, train, x, grad, dtype, device, state):
    m = make().to(dtype).to(device)
    m.load_state_dict(state)
    m.train(train)
    x = x.to(device).detach().requires_grad_()
    inner = x.view_as(x)  # a non-leaf alias: its hook sees the gradient as the layer's backward made it
    seen = []
    inner.register_hook(seen.append)
    try:
        y = m(inner)
        y.backward(grad.to(device))
    except RuntimeError as e:
        return type(e)
    return {"output": y, "input gradient": seen[0], "leaf gradient": x.grad,
            **{f"gradient of {n}": p.grad for n, p in m.named_parameters()},
            **{f"buffer {n}": b for n, b in m.named_buffers()}}


def describe(t):
    return None if t is None else (tuple(t.shape), t.dtype, t.stride())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("ndim", [4, 5])
@pytest.mark.parametrize("name", list(modules(4)))
def test_forward_and_backward_match_the_cpu_in_every_layout(name, ndim, dtype):
    make, train = modules(ndim)[name]
    shape = (2, C, 4, 5) if ndim == 4 else (2, C, 3, 4, 5)
    g = torch.Generator().manual_seed(SEED)
    reference = make().to(dtype)
    with torch.no_grad():
        for p in reference.parameters():
            p.copy_(torch.rand(p.shape, generator=g) + 0.5)
        if getattr(reference, "running_mean", None) is not None:
            reference.running_mean.copy_(torch.rand(C, generator=g))
            reference.running_var.copy_(torch.rand(C, generator=g) + 0.5)
    state = reference.state_dict()
    forms = layouts(ndim)
    failures = []
    for lname, layout in forms.items():
        x = layout(torch.randn(shape, generator=g).to(dtype))
        grad = torch.randn(shape, generator=g).to(dtype)
        for gname in (lname, other_format(lname)):
            cpu = run(make, train, x, forms[gname](grad), dtype, "cpu", state)
            dev = run(make, train, x, forms[gname](grad), dtype, DEV, state)
            where = f"input {lname}, gradient {gname}"
            if isinstance(cpu, type) or isinstance(dev, type):
                if cpu is not dev:
                    failures.append(f"{where}: the CPU gives {cpu}, {DEV} {dev}")
                continue
            for what, a in cpu.items():
                b = dev[what]
                if describe(a) != describe(b if b is None else b.cpu()) or (a is not None and b.device.type != DEV):
                    failures.append(f"{where}: {what}: {describe(a)} on the CPU, {describe(b)} on {DEV}")
                elif a is not None and not torch.equal(a, b.cpu()):
                    diff = (a.double() - b.cpu().double()).abs().max().item()
                    failures.append(f"{where}: {what} differs, by up to {diff:.3g}")
    assert not failures, "\n".join(failures)


def test_group_norm_node_is_pytorchs_to_python():
    x = torch.randn(2, C, 3, 3, device=DEV, requires_grad=True)
    y = nn.functional.group_norm(x, 4)
    assert type(y.grad_fn).__name__ == "NativeGroupNormBackward0"
    assert (y.grad_fn._saved_N, y.grad_fn._saved_group) == (2, 4)
    assert y.grad_fn.next_functions[0][0].variable is x


def test_group_norm_double_backward_and_forward_ad_match_the_cpu():
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(2, C, 3, 4, dtype=torch.float64, generator=g).contiguous(memory_format=torch.channels_last)
    w, t = torch.rand(C, dtype=torch.float64, generator=g), torch.randn(x.shape, dtype=torch.float64, generator=g)
    results = {}
    for device in ("cpu", DEV):
        xd, wd = x.to(device).requires_grad_(), w.to(device).requires_grad_()
        y = nn.functional.group_norm(xd, 4, wd)
        gx, = torch.autograd.grad((y * y.detach()).sum(), xd, create_graph=True)
        gw, = torch.autograd.grad(gx.pow(2).sum(), wd)
        with torch.autograd.forward_ad.dual_level():
            # (contiguous: PyTorch's forward-mode formula for group norm views a channels-last tangent, and fails)
            dual = torch.autograd.forward_ad.make_dual(x.contiguous().to(device), t.to(device))
            tangent = torch.autograd.forward_ad.unpack_dual(nn.functional.group_norm(dual, 4, w.to(device))).tangent
        results[device] = (gx.detach(), gw, tangent)
    for what, a, b in zip(("gradient", "double backward", "forward-mode tangent"), results["cpu"], results[DEV]):
        assert a.stride() == b.stride() and torch.equal(a, b.cpu()), what
