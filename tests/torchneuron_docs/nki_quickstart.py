"""An NKI kernel called from PyTorch, as TorchNeuron's NKI quickstart does it: an @nki.jit kernel, made
an operator with nki_op, given a backward, used eagerly, compiled and in training."""
import nki
import nki.language as nl
import torch
from torch_neuronx import nki_op


@nki.jit
def scaled_add_kernel(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    x = nl.load(a)
    y = nl.load(b)
    nl.store(out, value=x * 2.0 + y)
    return out


@nki_op("quickstart::scaled_add", mutates_args={})
def scaled_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return scaled_add_kernel(a, b)


def backward(ctx, grad):
    return grad * 2.0, grad


scaled_add.register_autograd(backward)

a = torch.randn(128, 512, device="neuron", requires_grad=True)
b = torch.randn(128, 512, device="neuron", requires_grad=True)
eager = scaled_add(a, b)
assert torch.equal(eager.detach().cpu(), a.detach().cpu() * 2.0 + b.detach().cpu())

compiled = torch.compile(lambda a, b: scaled_add(a, b).relu().sum(), backend="neuron", fullgraph=True)
compiled(a, b).backward()
want = (a.detach().cpu() * 2.0 + b.detach().cpu()) > 0
assert torch.equal(b.grad.cpu(), want.float()) and torch.equal(a.grad.cpu(), want.float() * 2.0)
print("OK NKI quickstart")
