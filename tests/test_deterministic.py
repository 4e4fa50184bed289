"""torch.use_deterministic_algorithms(True) on `neuron`, against the CPU: with
torch.utils.deterministic.fill_uninitialized_memory (its default), memory a
factory or resize_ hands out uninitialised holds NaN (integers: their
maximum), with the CPU's values, dtypes and strides."""
import pytest
import torch

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
          torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool]


@pytest.fixture
def deterministic():
    was = torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(was[0])
    torch.utils.deterministic.fill_uninitialized_memory = was[1]


def grown(dev, dtype, shape, transposed=False):
    t = torch.zeros(2, 3, dtype=dtype, device=dev)
    if transposed:
        t = t.t()
    t.resize_(shape)
    return t


MAKERS = {
    "empty": lambda dev, dt: torch.empty(5, 3, dtype=dt, device=dev),
    "empty channels_last": lambda dev, dt: torch.empty(2, 3, 2, 2, dtype=dt, device=dev,
                                                       memory_format=torch.channels_last),
    "empty_strided": lambda dev, dt: torch.empty_strided((2, 3), (1, 2), dtype=dt, device=dev),
    "empty_like": lambda dev, dt: torch.empty_like(torch.zeros(3, 4, dtype=dt, device=dev).t()),
    "new_empty": lambda dev, dt: torch.zeros(3, dtype=dt, device=dev).new_empty(4),
    "resize_ grows": lambda dev, dt: grown(dev, dt, (4, 5)),
    "resize_ of a transposed tensor": lambda dev, dt: grown(dev, dt, (4, 4), transposed=True),
    "resize_ shrinks": lambda dev, dt: grown(dev, dt, (2,)),
    "large empty": lambda dev, dt: torch.empty(1 << 18, dtype=dt, device=dev),
}


@pytest.mark.parametrize("maker", MAKERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_uninitialised_memory_is_filled_as_on_the_cpu(deterministic, maker, dtype):
    cpu, neuron = MAKERS[maker]("cpu", dtype), MAKERS[maker]("neuron", dtype)
    assert (neuron.dtype, neuron.shape, neuron.stride()) == (cpu.dtype, cpu.shape, cpu.stride())
    torch.testing.assert_close(neuron.cpu(), cpu, rtol=0, atol=0, equal_nan=True)


def test_resize_fills_only_the_new_memory(deterministic):
    got = []
    for dev in ("cpu", "neuron"):
        t = torch.arange(6.0, device=dev)
        t.resize_(10)
        got.append(t.cpu())
    torch.testing.assert_close(got[1], got[0], rtol=0, atol=0, equal_nan=True)
    assert got[1][:6].tolist() == [0, 1, 2, 3, 4, 5] and got[1][6:].isnan().all()


def test_resize_of_an_untyped_storage_view(deterministic):
    """resize_ grows the storage the tensor's offset sits in: the fill starts where the old storage ended."""
    got = []
    for dev in ("cpu", "neuron"):
        base = torch.arange(8, dtype=torch.int32, device=dev)
        t = base[2:]
        t.resize_(9)
        got.append((base.cpu(), t.cpu()))
    for c, n in zip(*got):
        assert torch.equal(n, c)
