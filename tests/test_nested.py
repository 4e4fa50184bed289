"""Nested tensors on neuron against the CPU: the strided layout (torch.nested.nested_tensor's default),
whose NestedTensorCPU kernels run on the neuron buffer, and the jagged layout, a Python subclass over
dense neuron tensors. Values bit for bit (the same CPU kernels run), and the same errors."""
import warnings

import pytest
import torch

warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype stage")


def _nt(device, layout=torch.strided, requires_grad=False):
    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(2, 6, generator=g), torch.randn(5, 6, generator=g)]
    return torch.nested.nested_tensor(parts, layout=layout, device=device, requires_grad=requires_grad)


def _w(device):
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(1)).to(device)


PROGRAMS = {
    "elementwise": lambda d, l: (_nt(d, l) * 2 + 1).sin(),
    "softmax": lambda d, l: _nt(d, l).softmax(-1),
    "linear": lambda d, l: torch.nn.functional.linear(_nt(d, l), _w(d)),
    "matmul by a nested transpose": lambda d, l: torch.matmul(_nt(d, l), _nt(d, l).transpose(-1, -2)),
    "layer_norm": lambda d, l: torch.nn.functional.layer_norm(_nt(d, l), (6,)),
    "to_padded_tensor": lambda d, l: torch.nested.to_padded_tensor(_nt(d, l), 0.0),
    "unbind": lambda d, l: _nt(d, l).unbind()[1] * 3,
}


def _components(r):
    if isinstance(r, torch.Tensor) and r.is_nested:
        return [t.cpu() for t in r.unbind()]
    return [r.cpu()]


def _outcome(fn):
    try:
        return _components(fn())
    except Exception as e:  # noqa: BLE001 - the exception is the outcome compared
        return type(e)


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged], ids=["strided", "jagged"])
@pytest.mark.parametrize("program", PROGRAMS)
def test_nested_program_matches_the_cpu(program, layout):
    cpu = _outcome(lambda: PROGRAMS[program]("cpu", layout))
    neuron = _outcome(lambda: PROGRAMS[program]("neuron", layout))
    if isinstance(cpu, type):
        assert neuron is cpu
        return
    assert not isinstance(neuron, type), neuron
    assert all(torch.equal(a, b) for a, b in zip(cpu, neuron, strict=True))


def test_nested_result_stays_on_neuron_and_nested():
    r = _nt("neuron") * 2
    assert r.is_nested and r.device.type == "neuron" and r.layout == torch.strided


def test_nested_backward_matches_the_cpu():
    grads = []
    for d in ("cpu", "neuron"):
        x = _nt(d, requires_grad=True)
        torch.nested.to_padded_tensor((x * x).sin(), 0.0).sum().backward()
        grads.append([t.cpu() for t in x.grad.unbind()])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_operator_without_a_nested_kernel_raises_not_implemented_as_on_the_cpu():
    for d in ("cpu", "neuron"):
        with pytest.raises(NotImplementedError):
            _nt(d).cumsum(0)
    with pytest.raises(NotImplementedError, match="jagged"):
        _nt("neuron").cumsum(0)
