"""The device generator: counter-based, reproducible per seed, independent of
the CPU's, its state saved and restored, and random operators queued like any
other."""
import pytest
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
    for _ in range(2):  # the first call of a signature runs synchronously; the second is queued
        big @ big
        torch.rand(10, device="neuron")
        busy = not torch.neuron.current_stream().query()
        torch.neuron.synchronize()
    assert busy  # the random operator queued behind the matmul, not waited for it



I64_MIN, I64_MAX = torch.iinfo(torch.int64).min, torch.iinfo(torch.int64).max

# random_(from, to) and random_(to): the CPU kernel's range checks (raised)
# and its precision warnings for floating-point ranges, per dtype.
RANDOM_RANGES = [
    (torch.uint16, (-1, 5)), (torch.uint16, (0, 70000)), (torch.uint32, (0, 2**32 + 1)), (torch.int8, (I64_MIN, 5)),
    (torch.int8, (-128, 128)), (torch.uint8, (300, None)), (torch.bool, (0, 3)), (torch.int32, (5, 5)),
    (torch.int64, (I64_MIN, None)), (torch.int64, (-42, I64_MAX)), (torch.float32, (0,)), (torch.float32, (-7,)),
    (torch.float32, (I64_MIN, 5)), (torch.float32, (-(2**30), 2**30)), (torch.float32, (-(2**30), None)),
    (torch.float16, (2**20, None)), (torch.float16, (0, 2**12)), (torch.bfloat16, (3, 4)), (torch.float64, (0, 2**60)),
]


def _random_outcome(device, dtype, args):
    """What t.random_(*args) does right at the call: its exception or "ok", and its warnings."""
    import warnings

    t = torch.empty(40, dtype=dtype, device=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            t.random_(*args)
            result = "ok"
        except RuntimeError as e:
            result = str(e)
    # (less the C++ source line a warning names: ATen's build, or our copy of its header)
    return result, [str(w.message).split(" (Triggered internally at")[0] for w in caught]


@pytest.mark.parametrize("dtype,args", RANDOM_RANGES, ids=[f"{d}-{a}" for d, a in RANDOM_RANGES])
def test_random_range_checks_and_warnings_come_at_every_call_as_on_the_cpu(dtype, args):
    want = _random_outcome("cpu", dtype, args)
    for _ in range(3):  # the first call of a signature runs synchronously, later ones queue
        assert _random_outcome("neuron", dtype, args) == want
    torch.neuron.synchronize()
    assert torch.neuron.device_errors()["total"] == 0  # nothing deferred


# Random calls on CPU tensors, each valid with a CPU generator.
CPU_DRAWS = {
    "randn": lambda g: torch.randn(3, generator=g),
    "randint": lambda g: torch.randint(0, 5, (3,), generator=g),
    "randperm": lambda g: torch.randperm(5, generator=g),
    "normal_": lambda g: torch.empty(3).normal_(generator=g),
    "random_": lambda g: torch.empty(3).random_(0, 5, generator=g),  # an explicit kernel, not the fallback
    "normal": lambda g: torch.normal(torch.zeros(3), 1.0, generator=g),
    "bernoulli": lambda g: torch.bernoulli(torch.full((3,), 0.5), generator=g),
    "multinomial": lambda g: torch.multinomial(torch.ones(3), 2, generator=g),
}


@pytest.mark.parametrize("draw", CPU_DRAWS.values(), ids=CPU_DRAWS)
def test_a_neuron_generator_for_cpu_tensors_is_refused_as_a_cuda_one_is(draw):
    """A generator's dispatch key joins the call's, so a `neuron` generator takes a CPU call to the
    device, as a CUDA generator takes it to CUDA; there the CPU kernel runs and refuses the
    generator, naming it in its own words (diffusers' randn_tensor meets this: docs/ecosystem.md)."""
    draw(torch.Generator("cpu").manual_seed(0))
    refusal = "^Expected a 'cpu' (device type for generator|generator device) but found 'neuron"
    with pytest.raises(RuntimeError, match=refusal):
        draw(torch.Generator("neuron").manual_seed(0))


def test_a_cpu_generator_for_neuron_tensors_is_refused_naming_it():
    with pytest.raises(RuntimeError, match="^Expected a 'neuron' device type for generator but found 'cpu'"):
        torch.randn(3, generator=torch.Generator("cpu"), device="neuron")
    with pytest.raises(RuntimeError, match="^Expected a 'neuron' device type for generator but found 'cpu'"):
        torch.empty(3, device="neuron").normal_(generator=torch.Generator("cpu"))
