"""Moving modules and tensors between the CPU and `neuron` keeps every
Parameter object, as a move to CUDA does: ties survive, optimizers made
before the move train the moved parameters, and `p.data = t` works across
devices. The reference is what the CPU does for a conversion that swaps data
in place (a dtype change), compared object by object."""
import pytest
import torch
from torch import nn

from neuron_testing import SEED


def tied_model():
    torch.manual_seed(SEED)
    m = nn.Sequential(nn.Embedding(11, 8), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 11))
    m[3].weight = m[0].weight  # tied input and output embeddings
    return m


def identities(m):
    return {name: id(p) for name, p in m.named_parameters(remove_duplicate=False)}


@pytest.mark.parametrize("move", [
    lambda m: m.to("neuron"),
    lambda m: m.neuron(),
    lambda m: m.to("neuron").cpu(),
    lambda m: m.to("neuron:0").to("neuron:1"),
    lambda m: m.to("neuron", torch.float64),
    lambda m: m.to(device="neuron", dtype=torch.bfloat16).to(torch.float32),
])
def test_parameters_keep_their_identity_and_ties(move):
    m = tied_model()
    before = identities(m)
    expected = identities(tied_model().double())  # the CPU's in-place conversion
    m = move(m)
    assert identities(m) == before
    assert len(list(m.parameters())) == len(list(tied_model().double().parameters()))
    assert m[3].weight is m[0].weight
    assert set(before) == set(expected)


def test_optimizer_made_before_the_move_trains_the_moved_model():
    def train(device):
        m = tied_model()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        m.to(device)
        tokens = torch.randint(0, 11, (4, 6), generator=torch.Generator().manual_seed(SEED)).to(device)
        losses = []
        for _ in range(5):
            loss = nn.functional.cross_entropy(m(tokens).flatten(0, 1), tokens.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, m

    cpu_losses, cpu_model = train("cpu")
    losses, model = train("neuron")
    assert losses == cpu_losses
    assert losses[-1] < losses[0]
    for (name, p), q in zip(model.named_parameters(), cpu_model.parameters()):
        assert p.device.type == "neuron", name
        assert torch.equal(p.cpu(), q), name
    assert model[3].weight is model[0].weight


def test_set_data_across_devices():
    p = nn.Parameter(torch.randn(3, 4))
    t = torch.randn(3, 4, device="neuron")
    p.data = t
    assert p.device.type == "neuron" and p.requires_grad
    assert torch.equal(p.detach().cpu(), t.cpu())
    p.sum().backward()
    assert p.grad.device.type == "neuron" and torch.equal(p.grad.cpu(), torch.ones(3, 4))
    p.data = torch.zeros(3, 4)
    assert p.device.type == "cpu"
    # Tensor types that cannot swap in place still refuse, as on the CPU.
    with pytest.raises(RuntimeError, match="incompatible tensor type"):
        torch.randn(2, device="neuron").data = torch.randn(2).to_sparse()


def test_gradients_move_with_their_parameters():
    m = nn.Linear(4, 2)
    m(torch.randn(3, 4)).sum().backward()
    weight, grad = m.weight, m.weight.grad
    m.to("neuron")
    assert m.weight is weight and m.weight.grad is grad
    assert grad.device.type == "neuron"
