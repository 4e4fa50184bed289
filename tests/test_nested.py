"""Nested tensors on neuron against the CPU: the strided layout (torch.nested.nested_tensor's default),
whose NestedTensorCPU kernels run on the neuron buffer, and the jagged layout, a Python subclass over
dense neuron tensors. Values bit for bit (the same CPU kernels run), and the same errors."""
import copy
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


def test_nested_tensor_from_mask_matches_the_cpu_and_its_error():
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(2))
    for keep, error in ((torch.tensor([[True, True, False], [True, True, True]]), None),
                        (torch.tensor([[True, False, True], [True, True, True]]), "left-aligned")):
        outcomes = []
        for d in ("cpu", "neuron"):
            try:
                outcomes.append(_components(torch._nested_tensor_from_mask(x.to(d), keep.to(d))))
            except RuntimeError as e:
                outcomes.append(str(e))
        if error:
            assert outcomes[0] == outcomes[1] and error in outcomes[0]
        else:
            assert all(torch.equal(a, b) for a, b in zip(*outcomes, strict=True))


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_fast_path_with_a_padding_mask_matches_the_cpu(norm_first):
    """In eval under no_grad, nn.TransformerEncoder makes its input a nested tensor from the padding mask
    and runs each layer's fast path (_transformer_encoder_layer_fwd) on it: bit for bit the CPU's."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=norm_first)
    cpu = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    dev = copy.deepcopy(cpu).to("neuron")
    x = torch.randn(3, 5, 8)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    with torch.no_grad():
        want = cpu(x, src_key_padding_mask=pad)
        for _ in range(2):  # the first call of a signature runs synchronously, later ones queue
            got = dev(x.to("neuron"), src_key_padding_mask=pad.to("neuron"))
            assert got.device.type == "neuron" and torch.equal(got.cpu(), want)
