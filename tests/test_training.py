"""Training-loop features on `neuron` against the CPU: autograd, every optimizer
path, autocast, random numbers, checkpoints, 64-bit exactness, views."""
import copy
import io

import pytest
import torch
import torch.nn as nn

SEED = 7


def _mlp():
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 3))


def _train(model, device, opt_factory, steps=4):
    model = model.to(device)
    opt = opt_factory(model.parameters())
    g = torch.Generator().manual_seed(SEED)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 12, generator=g).to(device)
        y = torch.randint(0, 3, (16,), generator=g).to(device)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


OPTIMIZERS = {
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adam_foreach": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
    "adamw_for_loop": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-2),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_matches_cpu_exactly(name):
    model = _mlp()
    neuron_losses, neuron_params = _train(copy.deepcopy(model), "neuron", OPTIMIZERS[name])
    cpu_losses, cpu_params = _train(model, "cpu", OPTIMIZERS[name])
    assert neuron_losses == cpu_losses
    for a, b in zip(neuron_params, cpu_params):
        assert torch.equal(a, b)


def _conv_net(p_drop):
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Dropout(p_drop), nn.Linear(16, 4))


def _train_conv(device, p_drop, seed=1):
    m = _conv_net(p_drop).to(device)
    if device == "neuron":
        torch.neuron.manual_seed(seed)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(5):
        x = torch.randn(8, 3, 16, 16, generator=g).to(device)
        y = torch.randint(0, 4, (8,), generator=g).to(device)
        loss = nn.functional.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, m[1].running_mean.cpu()


def test_conv_batchnorm_network_matches_cpu():
    (ln, rn), (lc, rc) = _train_conv("neuron", 0.0), _train_conv("cpu", 0.0)
    for a, b in zip(ln, lc):
        assert abs(a - b) <= 1e-5 * abs(b)
    torch.testing.assert_close(rn, rc)


def test_conv_network_with_dropout_is_reproducible_per_seed():
    first, again, other = (_train_conv("neuron", 0.3, seed)[0] for seed in (4, 4, 5))
    assert first == again
    assert first != other


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_follows_cuda_lists(dtype):
    lin = nn.Linear(8, 8).neuron()
    x = torch.randn(4, 8, device="neuron")
    with torch.autocast(device_type="neuron", dtype=dtype):
        y = lin(x)
        s = torch.softmax(y, dim=-1)  # an fp32 op on CUDA's lists
    assert y.dtype == dtype
    assert s.dtype == torch.float32
    assert torch.neuron.get_amp_supported_dtype() == [torch.float32, torch.float16, torch.bfloat16]
    assert torch.neuron.is_bf16_supported()


def test_checkpoint_round_trip():
    m = _mlp().neuron()
    buf = io.BytesIO()
    torch.save({"model": m.state_dict(), "x": torch.arange(3, device="neuron:1")}, buf)
    for where, expect in [(None, "neuron:0"), ("cpu", "cpu"), ("neuron:1", "neuron:1")]:
        buf.seek(0)
        ck = torch.load(buf, map_location=where)
        w = ck["model"]["0.weight"]
        assert str(w.device) == expect
        assert torch.equal(w.cpu(), m[0].weight.detach().cpu())
    buf.seek(0)
    assert torch.load(buf)["x"].device == torch.device("neuron:1")


def test_64_bit_types_are_exact():
    big = torch.tensor([2**53 + 1, -(2**62) + 7, 123456789012345], dtype=torch.int64)
    assert torch.equal((big.neuron() * 3 - 5).cpu(), big * 3 - 5)
    x = torch.tensor([1e-300, 1.0 + 2**-52, 3.141592653589793], dtype=torch.float64)
    assert torch.equal((x.neuron() * 1.5).cpu(), x * 1.5)
    assert x.neuron().sum().item() == x.sum().item()


def test_views_share_memory_and_in_place_updates_are_visible():
    base = torch.zeros(4, 6, device="neuron")
    v = base.t()[1:3]
    assert v.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    v.fill_(5)
    row = base[2]
    row.add_(1)
    expected = torch.zeros(4, 6)
    expected.t()[1:3].fill_(5)
    expected[2].add_(1)
    assert torch.equal(base.cpu(), expected)
    assert torch.equal(base.view(24)[:6].cpu(), expected.view(24)[:6])


def test_data_dependent_ops_and_fallback_tracking():
    import torchneuron

    torchneuron.clear_op_tracking()
    x = torch.tensor([0.0, 3.0, 0.0, 1.0], device="neuron")
    assert x.nonzero().flatten().tolist() == [1, 3]
    assert x[x > 0].tolist() == [3.0, 1.0]
    assert torch.unique(torch.tensor([3, 1, 3], device="neuron")).tolist() == [1, 3]
    executed = torchneuron.get_executed_ops()
    assert executed.get("aten::nonzero", 0) >= 1
    assert torchneuron.get_fallback_ops() == {}


def test_log_softmax_backward_of_a_transposed_gradient():
    # The meta function gives the result the gradient's strides; the CPU out=
    # kernel would then write a transposed result as if contiguous.
    g, x = torch.randn(64, 64).t(), torch.randn(64, 64)
    out = torch.log_softmax(x, -1)
    expected = torch.ops.aten._log_softmax_backward_data(g, out, -1, torch.float32)
    got = torch.ops.aten._log_softmax_backward_data(g.to("neuron"), out.to("neuron"), -1, torch.float32)
    torch.testing.assert_close(got.cpu(), expected)


def test_foreach_update_is_one_task_and_new_float_values_reuse_its_meta():
    """An in-place foreach op (the optimizers' updates) is one device task, not
    one per tensor; and a float argument that changes every step (AdamW's bias
    corrections, a learning-rate schedule) reuses the cached meta pass: the
    result of an in-place op cannot change shape with it."""
    import torchneuron
    g = torch.Generator().manual_seed(SEED)
    cpu = [torch.randn(n, generator=g) for n in (3, 70, 1000)]
    dev = [t.to("neuron") for t in cpu]
    torchneuron.clear_op_tracking()
    for step in range(1, 13):
        for ts in (cpu, dev):
            torch._foreach_mul_(ts, 1 - 0.9 ** step)
            torch._foreach_add_(ts, [0.5 / step, -0.25 * step, float(step)])
        if step == 2:
            entries = torchneuron._C._meta_cache_entries()
    assert torchneuron._C._meta_cache_entries() == entries
    executed = torchneuron.get_executed_ops()
    assert executed.get("aten::_foreach_mul_.Scalar") == 12 and executed.get("aten::_foreach_add_.ScalarList") == 12
    assert not any(name.startswith(("aten::mul", "aten::add")) for name in executed), executed
    for a, b in zip(dev, cpu):
        assert torch.equal(a.cpu(), b)
