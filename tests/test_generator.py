"""The device generator: counter-based, reproducible per seed, independent of
the CPU's, its state saved and restored, and random operators queued like any
other."""
import torch
import torch.nn as nn


def test_dropout_uses_the_device_generator():
    def masks(seed):
        torch.neuron.manual_seed(seed)
        drop = nn.Dropout(0.5).train()
        return [drop(torch.ones(64, device="neuron")).cpu() for _ in range(3)]

    a, b, c = masks(1), masks(1), masks(2)
    assert all(torch.equal(x, y) for x, y in zip(a, b))  # same seed, same result
    assert not torch.equal(a[0], c[0])
    assert not torch.equal(a[0], a[1])
    assert set(a[0].unique().tolist()) <= {0.0, 2.0}


def test_rng_reproducible_and_independent_of_cpu():
    torch.neuron.manual_seed(11)
    a = torch.randn(100, device="neuron").cpu()
    torch.neuron.manual_seed(11)
    torch.randn(1000)  # the CPU generator moves; the device's must not
    b = torch.randn(100, device="neuron").cpu()
    assert torch.equal(a, b)
    state = torch.neuron.get_rng_state()
    c = torch.rand(5, device="neuron").cpu()
    torch.neuron.set_rng_state(state)
    assert torch.equal(torch.rand(5, device="neuron").cpu(), c)
    g = torch.Generator(device="neuron").manual_seed(3)
    d = torch.rand(5, device="neuron", generator=g).cpu()
    g.manual_seed(3)
    assert torch.equal(torch.rand(5, device="neuron", generator=g).cpu(), d)
    torch.manual_seed(5)  # seeds the device too
    e = torch.rand(3, device="neuron").cpu()
    torch.manual_seed(5)
    assert torch.equal(torch.rand(3, device="neuron").cpu(), e)


def test_random_ops_are_queued_not_synchronous():
    torch.neuron.manual_seed(0)
    big = torch.randn(1024, 1024, device="neuron")
    big @ big
    torch.rand(10, device="neuron")
    assert not torch.neuron.current_stream().query()

