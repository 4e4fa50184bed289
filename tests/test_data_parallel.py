"""nn.DataParallel over two neuron devices (patch ``nn-parallel-comm``,
torchneuron/parallel_comm.py) against the computation it stands for, done by
hand on the CPU and on one neuron device.

DataParallel splits the batch into one chunk per device, runs a replica of the
module on each (replica 0 shares the module's parameters and buffers, so batch
norm's running statistics come from chunk 0 alone), concatenates the outputs
and sums the replicas' parameter gradients in device order (comm.reduce_add:
device 0's plus device 1's). The reference does exactly that: the module on
each chunk, gradients taken per chunk and added chunk 0 + chunk 1. Every kernel
is the CPU's, so outputs, gradients, running statistics and parameters after
SGD steps are compared bit for bit.
"""
import copy

import pytest
import torch
import torch.nn as nn
from torch.nn.parallel import comm

import torchneuron  # noqa: F401
from neuron_testing import SEED

DEV = "neuron"
pytestmark = pytest.mark.skipif(torch.neuron.device_count() < 2, reason="needs two neuron devices")


def make_model():
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 5))


def batch(n):
    g = torch.Generator().manual_seed(SEED + n)
    return torch.randn(n, 3, 6, 6, generator=g), torch.randn(n, 5, generator=g)


def reference_step(model, x, w, chunks, lr):
    """One step of what DataParallel computes, by hand on `model`'s device:
    output, input gradient, parameter gradients (summed chunk 0 + chunk 1 + ...)."""
    params = list(model.parameters())
    outs, gxs, grads = [], [], None
    for i, (xc, wc) in enumerate(zip(x.chunk(chunks), w.chunk(chunks))):
        replica = model if i == 0 else copy.deepcopy(model)  # other replicas' buffer updates are lost
        xc = xc.detach().requires_grad_()
        out = replica(xc)
        g = torch.autograd.grad((out * wc).sum(), [xc, *replica.parameters()])
        outs.append(out.detach())
        gxs.append(g[0])
        grads = list(g[1:]) if grads is None else [a + b for a, b in zip(grads, g[1:])]
    with torch.no_grad():
        for p, g in zip(params, grads):
            p.sub_(g, alpha=lr)
    return torch.cat(outs), torch.cat(gxs), grads


def dp_step(dp, opt, x, w):
    opt.zero_grad()
    x = x.detach().requires_grad_()
    out = dp(x)
    (out * w.to(out.device)).sum().backward()
    grads = [p.grad.clone() for p in dp.module.parameters()]
    opt.step()
    return out.detach(), x.grad, grads


def assert_same(ref, got, what):
    assert got.device.type in (DEV, "cpu"), what
    assert ref.shape == got.shape and ref.dtype == got.dtype, what
    assert torch.equal(ref.cpu(), got.cpu()), f"{what}: max difference {(ref.cpu() - got.cpu()).abs().max()}"


@pytest.mark.parametrize("ref_device", ["cpu", f"{DEV}:0"])
@pytest.mark.parametrize("n", [6, 5])  # 5: chunks of 3 and 2
def test_training_matches_the_chunked_computation(ref_device, n):
    lr = 0.1
    ref = make_model().to(ref_device)
    model = make_model().to(f"{DEV}:0")
    dp = nn.DataParallel(model, device_ids=[0, 1])
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(3):
        x, w = batch(n + step * 2)
        r_out, r_gx, r_grads = reference_step(ref, x.to(ref_device), w.to(ref_device), 2, lr)
        out, gx, grads = dp_step(dp, opt, x.to(f"{DEV}:0"), w)
        assert out.device == torch.device(DEV, 0)
        assert_same(r_out, out, f"step {step}: output")
        assert_same(r_gx, gx, f"step {step}: input gradient")
        for (name, _), a, b in zip(model.named_parameters(), r_grads, grads):
            assert_same(a, b, f"step {step}: gradient of {name}")
        for (name, a), b in zip(ref.state_dict().items(), model.state_dict().values()):
            assert_same(a, b, f"step {step}: {name} after the SGD step")


def test_one_device_runs_the_module_on_the_whole_batch():
    ref, model = make_model(), make_model().to(DEV)
    dp = nn.DataParallel(model, device_ids=[0])
    x, w = batch(6)
    xr, xd = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    (ref(xr) * w).sum().backward()
    out = dp(xd)
    (out * w.to(DEV)).sum().backward()
    assert_same(ref(x).detach(), dp(x.to(DEV)).detach(), "output")
    assert_same(xr.grad, xd.grad, "input gradient")
    for (name, a), b in zip(ref.named_parameters(), model.parameters()):
        assert_same(a.grad, b.grad, f"gradient of {name}")


def test_host_input_and_host_output_device():
    model = make_model().to(DEV)
    # -1: the host, as on CUDA (DataParallel refuses "cpu"; comm.gather warns that -1 is deprecated)
    dp = nn.DataParallel(model, device_ids=[0, 1], output_device=-1)
    x, w = batch(6)
    ref = make_model()
    r_out, _, _ = reference_step(ref, x, w, 2, lr=0.0)
    with pytest.warns(FutureWarning, match="Using -1 to represent CPU tensor is deprecated"):
        out = dp(x)  # scattered from the host on background streams, gathered to the host
    assert out.device.type == "cpu"
    assert_same(r_out, out, "output")


def test_replicas_run_on_their_devices():
    seen = []

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 2)

        def forward(self, x):
            seen.append((x.device, self.linear.weight.device, torch.neuron.current_device()))
            return self.linear(x)

    dp = nn.DataParallel(Probe().to(DEV), device_ids=[0, 1])
    out = dp(torch.randn(4, 3, device=DEV))
    assert out.device == torch.device(DEV, 0)
    assert sorted((a.index, b.index, c) for a, b, c in seen) == [(0, 0, 0), (1, 1, 1)]


def test_bad_device_ids():
    model = make_model().to(DEV)
    x = batch(6)[0].to(DEV)
    with pytest.raises(IndexError, match=f"invalid {DEV} device index 5"):
        nn.DataParallel(model, device_ids=[0, 5])(x)
    with pytest.raises(RuntimeError, match="Device index must not be negative"):
        nn.DataParallel(model, device_ids=[-1, 0])
    with pytest.raises(RuntimeError, match=rf"module must have its parameters and buffers on device {DEV}:1"):
        nn.DataParallel(model, device_ids=[1, 0])(x)
    with pytest.raises(RuntimeError, match=rf"on device {DEV}:0 \(device_ids\[0\]\) but found one of them on device: cpu"):
        nn.DataParallel(make_model(), device_ids=[0, 1])(x)


def test_comm_functions():
    t = torch.arange(12.0).reshape(4, 3)
    src = t.to(DEV)
    a, b = comm.broadcast(src, [0, 1])
    assert a is src and b.device == torch.device(DEV, 1) and torch.equal(b.cpu(), t)
    (a0, a1), (b0, b1) = comm.broadcast_coalesced([src, src[0]], [0, 1])
    assert a0 is src and torch.equal(b0.cpu(), t) and torch.equal(b1.cpu(), t[0])
    b0.add_(1)  # the copies share one buffer's storage history, not its version counter
    assert b1._version == 0
    with pytest.raises(RuntimeError, match=r"All tensors must be on devices\[0\]: 1"):
        comm.broadcast_coalesced([src], [1, 0])
    c0, c1 = comm.scatter(src, [0, 1], chunk_sizes=[1, 3])
    assert c0.data_ptr() == src.data_ptr() and c1.device == torch.device(DEV, 1)
    assert torch.equal(c1.cpu(), t[1:])
    with pytest.raises(RuntimeError, match="Expected devices and chunk_sizes to be of same length"):
        comm.scatter(src, [0, 1], chunk_sizes=[4])
    g = comm.gather([c0, c1], dim=0, destination=1)
    assert g.device == torch.device(DEV, 1) and torch.equal(g.cpu(), t)
    cl = torch.randn(2, 3, 4, 5).to(DEV, memory_format=torch.channels_last)
    assert comm.gather([cl, cl.to(f"{DEV}:1")], dim=0).is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(RuntimeError, match="Input tensor at index 1 has invalid shape"):
        comm.gather([c0, src], dim=1)
    with pytest.raises(RuntimeError, match=f"Expected all input tensors to be {DEV} tensors"):
        comm.gather([c0, t], dim=0)
    out = torch.empty(4, 3, device=f"{DEV}:1")
    assert comm.gather([c0, c1], dim=0, out=out)[0] is not None and torch.equal(out.cpu(), t)
