"""Copy-on-write clones (torch._lazy_clone) of `neuron` tensors, against the
same programs on the CPU: both tensors share memory until one is written,
the written one then gets memory of its own (a copy, or the original when it
is the last one sharing it), reads never copy; values, strides and which
tensors still share memory equal the CPU's."""
import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_map

from neuron_testing import queue_busy_work


def cow(t):
    return torch._C._is_cow_tensor(t)


def shares(a, b):
    return torch._C._data_address(a) == torch._C._data_address(b)


def state(x, y):
    """What a test may compare across devices (_data_address never materialises)."""
    return x.cpu(), y.cpu(), cow(x), cow(y), shares(x, y), x.stride(), y.stride()


def assert_same_state(cpu, neuron):
    for c, n in zip(cpu[:2], neuron[:2]):
        torch.testing.assert_close(n, c, rtol=0, atol=0, equal_nan=True)
    assert neuron[2:] == cpu[2:], f"(cow x, cow y, shared, strides): neuron {neuron[2:]}, cpu {cpu[2:]}"


def program(dev, f, n=12):
    x = torch.arange(float(n), device=dev).reshape(3, n // 3)
    y = torch._lazy_clone(x)
    f(x, y)
    return state(x, y)


def index_on(y):
    return torch.tensor([0, 2], device=y.device)


WRITES = {
    "nothing": lambda x, y: None,
    "reads": lambda x, y: (x + y, x @ y.T, y.sum(), torch.sin(x)),
    "lean in place": lambda x, y: y.add_(1),
    "generic in place": lambda x, y: y.sin_(),
    "the original written": lambda x, y: x.mul_(3),
    "setitem": lambda x, y: y.__setitem__(0, 5.0),
    "through a view": lambda x, y: y.view(-1)[1:4].add_(1),
    "copy_ onto it": lambda x, y: y.copy_(torch.ones_like(y)),
    "out=": lambda x, y: torch.exp(x, out=y),
    "index_put_": lambda x, y: y.index_put_((index_on(y),), torch.tensor(9.0, device=y.device)),
    "fill_ and zero_": lambda x, y: (y.fill_(2), x.zero_()),
    "a chain": lambda x, y: y.mul_(2).add_(1).sin_(),
    "set_": lambda x, y: y.set_(torch.zeros(3, device=y.device)),
    "resize_ smaller": lambda x, y: y.resize_(2),
}


@pytest.mark.parametrize("name", WRITES)
def test_writes_materialise_as_on_the_cpu(name):
    assert_same_state(program("cpu", WRITES[name]), program("neuron", WRITES[name]))


@pytest.mark.parametrize("name", ["generic in place", "a chain", "through a view", "copy_ onto it", "out="])
def test_fusable_sizes(name):
    n = 3 * (1 << 18)
    assert_same_state(program("cpu", WRITES[name], n), program("neuron", WRITES[name], n))


def test_clone_shares_then_separates():
    for dev in ("cpu", "neuron"):
        t = torch.tensor([[0, 1], [2, 3]], device=dev, dtype=torch.int64)
        address = torch._C._data_address(t)
        clone = t._lazy_clone()
        assert cow(t) and cow(clone) and torch._C._data_address(clone) == address
        assert torch._C._storage_address(t) != torch._C._storage_address(clone)
        clone[0, 0] = 100
        assert not cow(clone) and torch._C._data_address(clone) != address
        assert torch._C._data_address(t) == address  # untouched
        assert t.tolist() == [[0, 1], [2, 3]] and clone.tolist() == [[100, 1], [2, 3]]
        # The last tensor sharing the memory takes it back without a copy.
        t.add_(1)
        assert not cow(t) and torch._C._data_address(t) == address


def test_lazy_clone_of_a_view():
    got = []
    for dev in ("cpu", "neuron"):
        x = torch.arange(12.0, device=dev).reshape(3, 4)
        v = torch._lazy_clone(x[1:, 1::2])
        before = (cow(x), cow(v), v.stride(), v.storage_offset())
        v.add_(1)
        got.append((before, cow(x), cow(v), v.stride(), v.storage_offset(), x.cpu(), v.cpu()))
    (cb, *c), (nb, *n) = got
    assert nb == cb and n[:4] == c[:4]
    torch.testing.assert_close(n[4:], c[4:], rtol=0, atol=0)


def test_materialising_waits_for_queued_work_and_orders_streams():
    x = torch.zeros(1 << 22, device="neuron")
    x.add_(1)  # queued
    y = torch._lazy_clone(x)
    x.mul_(3)
    y.add_(2)
    assert x.sum().item() == 3 * (1 << 22) and y.sum().item() == 3 * (1 << 22)
    # Written on another stream than the one that produced the data, still queued there.
    s = torch.neuron.Stream()
    queue_busy_work()
    x = torch.ones(1 << 20, device="neuron")
    y = torch._lazy_clone(x)
    with torch.neuron.stream(s):
        y.mul_(5)
    torch.neuron.synchronize()
    assert x.sum().item() == 1 << 20 and y.sum().item() == 5 << 20


def test_memory_is_returned():
    torch.neuron.synchronize()
    base = torch.neuron.memory_allocated()
    x = torch.ones(1 << 20, device="neuron")
    y = torch._lazy_clone(x)
    z = torch._lazy_clone(y)
    assert torch.neuron.memory_allocated() == base + (4 << 20)  # one allocation shared by three
    z.add_(1)
    assert torch.neuron.memory_allocated() == base + (8 << 20)
    del x, y  # the last two sharing the first allocation
    assert torch.neuron.memory_allocated() == base + (4 << 20)
    del z
    assert torch.neuron.memory_allocated() == base


def test_record_stream_on_a_lazy_clone():
    # Written on another stream than the one that produced the data, still queued there.
    s = torch.neuron.Stream()
    queue_busy_work()
    x = torch.ones(1 << 20, device="neuron")
    y = torch._lazy_clone(x)
    s.wait_stream(torch.neuron.current_stream())  # y's data first, as on CUDA
    with torch.neuron.stream(s):
        z = y * 2
    y.record_stream(s)
    del x, y
    torch.neuron.current_stream().wait_stream(s)
    assert z.sum().item() == 2 << 20


def test_batch_norm_running_stats():
    """native_batch_norm writes its running statistics though its schema does not say so, and only in training."""
    got = {}
    for dev in ("cpu", "neuron"):
        torch.manual_seed(0)
        x = torch.randn(4, 3, 5).to(dev)
        for training in (False, True):
            mean, var = torch.zeros(3, device=dev), torch.ones(3, device=dev)
            m, v = torch._lazy_clone(mean), torch._lazy_clone(var)
            for f in (torch.native_batch_norm, torch._native_batch_norm_legit):
                out = f(x, None, None, m, v, training, 0.1, 1e-5)[0]
                got[dev, training, f.__name__] = (cow(m), cow(v), m.cpu().clone(), v.cpu().clone(), out.cpu())
    for key in [k for k in got if k[0] == "cpu"]:
        c, n = got[key], got[("neuron",) + key[1:]]
        assert n[:2] == c[:2], key
        torch.testing.assert_close(n[2:], c[2:])


def _run(dev, fn, sample):
    """fn on lazy clones of sample's tensors (moved to dev); the clones' copy-on-write
    states afterwards and the results on the CPU, or the exception's type."""
    s = sample.transform(lambda t: t.detach().clone().to(dev) if isinstance(t, torch.Tensor) else t)
    args, kwargs = tree_map(lambda t: torch._lazy_clone(t) if isinstance(t, torch.Tensor) and t.layout == torch.strided
                            else t, ([s.input, *s.args], dict(s.kwargs)))
    clones = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.layout == torch.strided]
    try:
        with torch.no_grad():
            result = fn(*args, **kwargs)
        torch.neuron.synchronize()
    except Exception as e:  # noqa: BLE001 (compared across devices below)
        return type(e), None
    return [cow(t) for t in clones], [t.cpu() for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)
                                      and t.layout == torch.strided]


# The CPU's channel_shuffle materialises the input it only reads (its OpInfo
# allows it); neuron leaves it shared, as a kernel that only reads should.
CPU_READS_MATERIALISE = {"nn.functional.channel_shuffle"}


def test_operators_materialise_exactly_what_they_write():
    """Every OpInfo operator, function and in-place variant, on lazy clones of its
    first sample: which clones still share memory afterwards is the CPU's."""
    compared, differ = 0, []
    for op in op_db:
        if op.name in CPU_READS_MATERIALISE or not op.supports_cow_input_no_materialize_forward:
            continue
        try:
            sample = next(iter(op.sample_inputs("cpu", torch.float32)))
        except Exception:  # noqa: BLE001 (an OpInfo without float32 samples)
            continue
        for fn in (op, op.inplace_variant):
            if fn is None:
                continue
            c, n = _run("cpu", fn, sample), _run("neuron", fn, sample)
            # Where either raises, moving the sample was the problem (host-only
            # arguments): the operator sweeps compare exceptions.
            if isinstance(c[0], type) or isinstance(n[0], type):
                continue
            compared += 1
            if n[0] != c[0]:
                differ.append((op.name, op.variant_test_name, fn is op, c[0], n[0]))
    assert compared > 700, compared
    assert not differ, differ
