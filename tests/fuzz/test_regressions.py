"""One test per finding of the fuzzer, each the smallest program that shows it.

Findings open on the current main are strict xfails naming the finding
(known_findings.py keeps them out of the random programs): when a fix lands,
the test XPASSes and fails loudly; then remove its xfail mark and the
finding's entry in known_findings.py together. Tests without a mark guard
findings that are fixed.

The executor runs the first call of each call signature (dtypes,
ranks, layouts, value classes, flags) synchronously, where the CPU kernel
decides, and queues later calls with what it taught (the meta pass's
prediction, or the CPU's layouts). So every case runs on neuron twice, and
both calls must match the CPU; a case whose check depends on values or sizes
first makes a call of the same signature that the kernel accepts (`warm`).
"""
import contextlib
import warnings

import pytest
import torch

try:
    from ..neuron_testing import FusableFrom, queue_busy_work, raw_bits
except ImportError:  # pytest puts tests/ itself on sys.path
    from neuron_testing import FusableFrom, queue_busy_work, raw_bits

DEV = "neuron"


def outcome(fn, device):
    """("call", exception type) if `fn(device)` raises at the call, ("sync", type) if the
    synchronisation after it does, or ("ok", its result on the host)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = fn(device)
        except Exception as e:  # noqa: BLE001 - compared
            with contextlib.suppress(Exception):
                torch.neuron.synchronize()
            torch.neuron.reset_errors()  # device errors are sticky: this one is seen
            return "call", type(e)
        try:
            torch.neuron.synchronize()
        except Exception as e:  # noqa: BLE001
            torch.neuron.reset_errors()
            return "sync", type(e)
    return "ok", result.cpu() if isinstance(result, torch.Tensor) else result


def same_outcome(fn, warm=None):
    """`fn` on neuron, twice (after `warm`, on both devices), as on the CPU."""
    if warm is not None:
        outcome(warm, "cpu"), outcome(warm, DEV)
    cpu = outcome(fn, "cpu")
    for call in ("first", "second"):
        dev = outcome(fn, DEV)
        assert cpu[0] == dev[0] and (cpu[0] != "ok" or _equal(cpu[1], dev[1])) and (
            cpu[0] == "ok" or cpu[1] is dev[1]), f"{call} call: CPU {cpu}, neuron {dev}"


def twice(fn):
    """`fn("neuron")` called twice: the first call of its signature and a later one."""
    return [fn(DEV) for _ in range(2)]


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)
    return a == b


def i16(*shape, device):
    return torch.ones(shape, dtype=torch.int16, device=device)


KERNEL_CHECKS = {  # (the call, a call of its signature the kernel accepts)
    "bitwise_and of float": (lambda d: torch.bitwise_and(torch.ones(3, device=d), torch.ones(3, device=d)), None),
    "floor_ of bool": (lambda d: torch.ones(3, dtype=torch.bool, device=d).floor_(), None),
    "std of int64": (lambda d: torch.arange(4, device=d).std(), None),
    "Scalar overflowing int16": (
        lambda d: torch.addcmul(i16(3, device=d), i16(3, device=d), i16(3, device=d), value=float("nan")),
        lambda d: torch.addcmul(i16(3, device=d), i16(3, device=d), i16(3, device=d), value=2)),
    "index_put of an empty value": (
        lambda d: torch.ones(3, device=d).__setitem__(torch.tensor([0], device=d), torch.ones(0, device=d)),
        lambda d: torch.ones(3, device=d).__setitem__(torch.tensor([0], device=d), torch.ones(1, device=d))),
    "mm of float32 and float64": (
        lambda d: torch.mm(torch.ones(2, 2, device=d), torch.ones(2, 2, dtype=torch.float64, device=d)), None),
    "index_select of an empty dimension": (
        lambda d: torch.index_select(torch.ones(2, 0, device=d), 1, torch.tensor([0], device=d)),
        lambda d: torch.index_select(torch.ones(2, 3, device=d), 1, torch.tensor([0], device=d))),
    "bitwise_not into a bfloat16 out=": (
        lambda d: torch.bitwise_not(torch.ones(3, dtype=torch.bool, device=d),
                                    out=torch.empty(3, dtype=torch.bfloat16, device=d)), None),
    "index_copy_ by an int32 index": (lambda d: torch.ones(3, device=d).index_copy_(
        0, torch.tensor([0], dtype=torch.int32, device=d), torch.ones(1, device=d)), None),
    "add of bool by a floating alpha": (
        lambda d: torch.add(torch.ones(3, dtype=torch.bool, device=d), torch.ones(3, dtype=torch.bool, device=d),
                            alpha=-1.25),
        lambda d: torch.add(torch.ones(3, dtype=torch.bool, device=d), torch.ones(3, dtype=torch.bool, device=d))),
    "mul_ of int8 by float16": (
        lambda d: torch.zeros(3, dtype=torch.int8, device=d).mul_(torch.ones(3, dtype=torch.float16, device=d)), None),
}


@pytest.mark.parametrize("case", KERNEL_CHECKS)
def test_kernel_checks_raise_at_the_call(case):
    """Fixed: checks only the CPU kernel makes (dtype dispatch, Scalar overflow, index_put's empty
    value, mm's dtypes, add's alpha, in-place casts) raise at the call."""
    fn, warm = KERNEL_CHECKS[case]
    same_outcome(fn, warm)


VALUE_CHECKS = {  # (the call, a call of its call signature but another value the kernel accepts)
    "fill_ with a complex Scalar": (lambda d: torch.zeros(2, device=d).fill_(1 + 2j),
                                    lambda d: torch.zeros(2, device=d).fill_(0.5)),
    "setitem of a complex Scalar": (lambda d: torch.zeros(2, device=d).__setitem__(0, 1 + 2j),
                                    lambda d: torch.zeros(2, device=d).__setitem__(0, 0.5)),
    "negative power of integers": (lambda d: torch.pow(torch.arange(3, device=d), -1),
                                   lambda d: torch.pow(torch.arange(3, device=d), 2)),
    "Scalar overflowing int8 after one that fits": (lambda d: torch.ones(3, dtype=torch.int8, device=d).add(1000),
                                                    lambda d: torch.ones(3, dtype=torch.int8, device=d).add(100)),
    "multinomial of more samples than categories": (
        lambda d: torch.multinomial(torch.ones(3, device=d), 4),
        lambda d: torch.multinomial(torch.ones(3, device=d), 2)),
    "multinomial of no samples": (
        lambda d: torch.multinomial(torch.ones(3, device=d), 0, replacement=True),
        lambda d: torch.multinomial(torch.ones(3, device=d), 5, replacement=True)),
    "integer division by zero": (
        lambda d: torch.div(torch.arange(3, device=d), 0, rounding_mode="floor"),
        lambda d: torch.div(torch.arange(3, device=d), 2, rounding_mode="floor")),
}


@pytest.mark.parametrize("case", VALUE_CHECKS)
def test_value_checks_raise_at_the_call_after_another_value(case):
    """Fixed: a Scalar's value class (sign, zero, integral, finite, the dtypes that hold it) is part
    of the call signature, so a check on it raises at the call after a call of another value."""
    fn, warm = VALUE_CHECKS[case]
    same_outcome(fn, warm)


SIZE_CHECKS = {  # (the call, a call of its call signature but other sizes the kernel accepts)
    "index_put of a value of another size": (
        lambda d: torch.ones(3, device=d).__setitem__(torch.tensor([1, 2], device=d), torch.ones(3, device=d)),
        lambda d: torch.ones(3, device=d).__setitem__(torch.tensor([1, 2], device=d), torch.ones(2, device=d))),
    "index_put_ accumulating a value of another size": (
        lambda d: torch.ones(3, 2, device=d).index_put_((torch.tensor([0, 2], device=d),), torch.ones(3, 2, device=d),
                                                        accumulate=True),
        lambda d: torch.ones(3, 2, device=d).index_put_((torch.tensor([0, 2], device=d),), torch.ones(2, 2, device=d),
                                                        accumulate=True)),
    "a mask of another shape": (
        lambda d: torch.ones(3, device=d).__setitem__(torch.tensor([True, False], device=d), torch.ones((), device=d)),
        lambda d: torch.ones(2, device=d).__setitem__(torch.tensor([True, False], device=d), torch.ones((), device=d))),
}


@pytest.mark.parametrize("case", SIZE_CHECKS)
def test_size_checks_raise_at_the_call_after_other_sizes(case):
    """Fixed: the meta pass makes the CPU kernel's checks its meta kernel lacks (exec/meta_checks.h)."""
    fn, warm = SIZE_CHECKS[case]
    same_outcome(fn, warm)


def test_lean_relu_of_complex_raises_at_the_call():
    same_outcome(lambda d: torch.relu(torch.ones(3, dtype=torch.complex64, device=d)))


OWN_MEMORY = {  # (the call, a call of its call signature the kernel accepts)
    "after an accepted call": (
        lambda d: (lambda x: x.__setitem__(torch.tensor([2], device=d), x))(torch.arange(3.0, device=d)),
        lambda d: torch.arange(5.0, device=d).index_put_((torch.tensor([0, 4], device=d),), torch.ones(2, device=d))),
    "of an empty tensor": (lambda d: (lambda x: x.__setitem__([], x))(torch.ones(0, dtype=torch.int32, device=d)),
                           None),
}


@pytest.mark.parametrize("case", OWN_MEMORY)
def test_index_put_of_its_own_memory_raises_at_the_call(case):
    fn, warm = OWN_MEMORY[case]
    same_outcome(fn, warm)


def test_kernel_check_in_a_fused_group_raises_at_the_call():
    """Fixed: relu's bool check, in a fused group."""
    def relu_of_bool(device):
        x = torch.ones(1 << 16, dtype=torch.bool, device=device)
        if device != "cpu":
            queue_busy_work()
        return torch.relu(x * True)
    with FusableFrom():
        same_outcome(relu_of_bool)


IN_PLACE_BROADCAST = {  # (the call, a call of its signature that does not broadcast self)
    "remainder_": (lambda d: i16(6, 2, device=d).remainder_(i16(2, 2, 6, 2, device=d)),
                   lambda d: i16(6, 2, device=d).remainder_(i16(1, 1, 6, 2, device=d))),
    "atan2_": (lambda d: torch.zeros((), device=d).atan2_(torch.ones(2, 1, device=d)),
               lambda d: torch.zeros((), device=d).atan2_(torch.ones(1, 1, device=d))),
    "bitwise_or_": (lambda d: i16(2, device=d).bitwise_or_(i16(3, 2, device=d)),
                    lambda d: i16(2, device=d).bitwise_or_(i16(1, 2, device=d))),
    "hypot_": (lambda d: torch.zeros(2, device=d).hypot_(torch.ones(3, 2, device=d)),
               lambda d: torch.zeros(2, device=d).hypot_(torch.ones(1, 2, device=d))),
}


@pytest.mark.parametrize("op", IN_PLACE_BROADCAST)
def test_in_place_broadcast_of_self_raises(op):
    """Fixed: in-place operators whose result would broadcast self raise as on the CPU."""
    fn, warm = IN_PLACE_BROADCAST[op]
    same_outcome(lambda d: fn(d).shape, lambda d: warm(d).shape)


def test_logical_and_in_place_broadcast_of_self_raises():
    same_outcome(lambda d: torch.zeros(1, device=d).logical_and_(torch.ones(3, dtype=torch.int8, device=d)).shape)


def test_internal_overlap_check_at_the_call():
    def addcmul_(x):
        return x.addcmul_(x, x)
    same_outcome(lambda d: addcmul_(torch.ones(2, 1, device=d).expand(2, 3)),
                 warm=lambda d: addcmul_(torch.ones(2, 3, device=d)))


META_LAYOUTS = {
    "copysign": lambda a, b: torch.copysign(a, b), "xlogy": lambda a, b: torch.xlogy(a, b),
    "floor_divide": lambda a, b: torch.floor_divide(a, b),
    "div floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "angle of complex": lambda a, b: torch.angle(a.to(torch.complex64)),
    "pow of a Scalar base": lambda a, b: 3 ** a,
    "add with alpha, broadcast": lambda a, b: torch.add(a[:, None, :].int(), b[:, 1:2].half(), alpha=-1),
    "index of a permuted tensor": lambda a, b: a.reshape(3, 1, 5, 2)[..., :1].permute(3, 1, 0, 2)[:, [0, 0, 0]],
}


@pytest.mark.parametrize("op", META_LAYOUTS)
def test_layouts_the_meta_kernel_gives_otherwise(op):
    a, b = torch.randn(6, 5).t(), torch.randn(5, 6)
    want = META_LAYOUTS[op](a, b)
    assert [got.stride() for got in twice(lambda d: META_LAYOUTS[op](a.to(d), b.to(d)))] == [want.stride()] * 2


def test_ldexp_of_a_permuted_tensor_keeps_the_cpus_nan_payloads():
    x = torch.randn(2, 6, 3, generator=torch.Generator().manual_seed(0)) * 300  # negative: log gives NaN
    want = torch.ldexp(x.permute(2, 1, 0), torch.log(x.permute(2, 1, 0)))
    for got in twice(lambda d: (lambda t: torch.ldexp(t, torch.log(t)))(x.to(d).permute(2, 1, 0))):
        assert torch.equal(raw_bits(got), raw_bits(want))


def test_resized_out_takes_the_cpus_strides():
    def exp_into_a_resized_out(device):
        out = torch.empty(3, device=device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the deprecation warning of resizing a non-empty out=
            torch.exp(torch.randn(4, 2).to(device).t(), out=out)
        return out.stride()
    assert twice(exp_into_a_resized_out) == [exp_into_a_resized_out("cpu")] * 2


def test_out_that_is_an_operand_and_resized():
    def matmul_into_its_operand(device):
        v = torch.arange(2.0, device=device)
        x = torch.arange(8.0, device=device).view(2, 4)
        torch.matmul(v, x, out=x)
        return x
    same_outcome(matmul_into_its_operand)


META_DTYPES = {
    "bool ** True": lambda d: torch.tensor([True, False], device=d) ** True,
    "clamp of float16 by a complex Scalar": lambda d: torch.clamp(torch.tensor([670.0, 1.0], dtype=torch.float16,
                                                                               device=d), 0j, 3),
}


@pytest.mark.parametrize("case", META_DTYPES)
def test_dtypes_the_meta_kernel_gives_otherwise(case):
    same_outcome(META_DTYPES[case])


def test_empty_out_of_another_dtype_grows_as_on_the_cpu():
    """Fixed: ATen computes a cast result into an out it is given otherwise than into one it grows (atan2 of
    int64 into complex64); a queued call lets the kernel grow an empty out= of a dtype no operand has."""
    def atan2_into_complex(device):
        g = torch.Generator().manual_seed(1002588)
        x = torch.randint(-1000, 1000, (2, 2, 7, 2), generator=g).to(device).contiguous(memory_format=torch.channels_last)
        y = torch.randint(-8, 8, (2, 7, 2, 2), generator=g).to(device)
        return torch.atan2(y.sum(), x, out=torch.empty(0, dtype=torch.complex64, device=device))
    want = raw_bits(atan2_into_complex("cpu"))
    for got in twice(atan2_into_complex):
        assert torch.equal(raw_bits(got), want)


META_DTYPES_SCALAR = {
    "clamp by a complex 0-dim tensor": lambda d: torch.clamp(torch.ones(3, 4, device=d) * 2,
                                                             torch.tensor(-0.0 + 0j, device=d), 1e-3),
}


@pytest.mark.parametrize("case", META_DTYPES_SCALAR)
def test_dtypes_of_scalar_overloads(case):
    same_outcome(META_DTYPES_SCALAR[case])


def test_set_storage_of_its_own_sizes_keeps_strides():
    """Fuzzer seed 102299: set_(storage, offset, size) of the sizes the tensor has keeps its strides, as the CPU's
    resize does (here an expanded tensor's zero stride)."""
    def set_onto(d):
        x = torch.zeros((), dtype=torch.float64).to(d).expand(7)
        y = torch.arange(7.0, dtype=torch.float64).to(d)
        x.set_(y.untyped_storage(), 0, (7,))
        return x.stride()
    same_outcome(set_onto)


def test_resize_to_its_own_shape_keeps_strides():
    same_outcome(lambda d: torch.randn(3, 2).to(d).t().resize_(2, 3).stride())


@pytest.mark.parametrize("form", ["x[1:].copy_(x[1:])", "x[1:] = x[:-1]"])
def test_copy_onto_the_same_view_of_an_expanded_tensor(form):
    def copy_onto_itself(device):
        x = torch.ones(1, device=device).expand(4)
        exec(form)
        return x.clone()  # .cpu() of an expanded tensor is dense, the CPU's own x is not
    same_outcome(copy_onto_itself)


def test_ldexp_of_an_integer_exponent():
    same_outcome(lambda d: torch.ldexp(torch.tensor([0.0, 3e38, 1.0], device=d), torch.tensor([30000, -200, 3], device=d)))


def test_copy_shape_check_at_the_call():
    same_outcome(lambda d: torch.arange(5.0, device=d)[::2].copy_(torch.arange(5.0, device=d)[1::2]))


SET_STORAGE = {
    "without strides": lambda t, s: t.set_(s, 1, (2, 2)),
    "at a negative offset": lambda t, s: t.set_(s, -1, (2,), (1,)),
}


@pytest.mark.parametrize("case", SET_STORAGE)
def test_set_of_a_storage_as_on_the_cpu(case):
    def set_storage(device):
        t = torch.zeros(3, device=device)
        SET_STORAGE[case](t, torch.arange(6.0, device=device).untyped_storage())
        return t.clone()
    same_outcome(set_storage)


DEGENERATE = {
    "zero-size result": lambda d: torch.heaviside(torch.ones(1, dtype=torch.bool, device=d),
                                                  torch.ones(5, 0, dtype=torch.bool, device=d).t()),
    "size-1 dimension": lambda d: torch.arange(2, device=d)[::2].flip(0),
}


@pytest.mark.parametrize("case", DEGENERATE)
def test_degenerate_strides(case):
    assert [t.stride() for t in twice(DEGENERATE[case])] == [DEGENERATE[case]("cpu").stride()] * 2


DEGENERATE_CONSEQUENCES = {
    ".to(channels_last) copies or returns": lambda d: (lambda y: y.to(memory_format=torch.channels_last) is y)(
        torch.arange(48, device=d).view(3, 2, 2, 4).contiguous(memory_format=torch.channels_last)[:, ::2].exp2()),
    "cat's layout": lambda d: (lambda v, x: torch.cat([v, x, x], -2).stride())(
        torch.eq(torch.arange(12, dtype=torch.uint8, device=d).view(2, 3, 2, 1).permute(3, 2, 0, 1), 0),
        torch.ones(1, 2, 2, 3, dtype=torch.bfloat16, device=d).contiguous(memory_format=torch.channels_last)),
}


@pytest.mark.parametrize("case", DEGENERATE_CONSEQUENCES)
def test_degenerate_strides_decide_memory_formats(case):
    assert twice(DEGENERATE_CONSEQUENCES[case]) == [DEGENERATE_CONSEQUENCES[case]("cpu")] * 2


@pytest.mark.xfail(strict=True, reason="undefined on the CPU, not neuron: matmul(x, y, out=x) resizes x before it "
                   "reads it, so it does not compute x @ y (it reads memory the resize left unwritten); the fuzzer "
                   "keeps out= arguments that are also operands and resized out")
def test_cpu_out_read_after_its_resize():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 3, generator=g), torch.randn(3, 4, generator=g)
    want = x @ y
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the deprecation warning of resizing a non-empty out=
        torch.matmul(x, y, out=x)
    assert torch.equal(x, want)


@pytest.mark.xfail(strict=True, reason="upstream, not neuron: the CPU's median over a dimension of an expanded "
                   "tensor reads memory it did not write (its result varies from run to run); the fuzzer keeps "
                   "median, kthvalue and mode of zero-stride tensors out")
def test_cpu_median_of_expanded_input_is_deterministic():
    x = torch.arange(4.0).view(2, 2).expand(5, 2, 2).permute(2, 0, 1)
    want = x.contiguous().median(1).values
    for _ in range(3):
        assert torch.equal(x.median(1).values, want)


@pytest.mark.xfail(strict=True, reason="upstream, not neuron: Inductor's vectorised argmin of uint8 returns a wrong "
                   "index, on the CPU as on neuron; the compiled path keeps index-returning reductions of 8-bit "
                   "integers out")
def test_inductor_argmin_of_uint8():
    x = torch.randint(0, 256, (6, 6, 2), generator=torch.Generator().manual_seed(8), dtype=torch.uint8)
    torch._dynamo.reset()
    assert torch.compile(lambda t: t.argmin(), backend="inductor")(x) == x.argmin()


@pytest.mark.xfail(strict=True, reason="upstream, not neuron: the shifts' meta kernel refuses bool tensors, which "
                   "eager shifts, so compiling a shift of a bool tensor fails on the CPU as on neuron; the compiled "
                   "path keeps shifts of bool tensors out")
def test_compiled_shift_of_bool():
    x = torch.tensor([True, False])
    torch._dynamo.reset()
    assert torch.equal(torch.compile(lambda t: t << 2, backend="inductor")(x), x << 2)


def test_compiled_graph_with_a_python_scalar_restarts_as_with_inductor():
    """Dynamo restarts the analysis of a frame to make a Python scalar (here a 0-dim CPU tensor's
    float) a tensor, by an exception it expects back from the backend: the neuron backend passes it
    through (it wrapped it into a NeuronCompileError)."""
    x = torch.randint(0, 8, (), dtype=torch.uint8).expand(3, 7)
    s = torch.tensor(0.5, dtype=torch.float64)
    torch._dynamo.reset()
    got = torch.compile(lambda a, b: b + a, backend="neuron")(x.to(DEV), s)
    want = s + x
    assert got.device == torch.device(DEV, 0) and got.dtype == want.dtype and torch.equal(got.cpu(), want)


@pytest.mark.parametrize("make", [lambda t: t.contiguous(memory_format=torch.channels_last), lambda t: t.mT],
                         ids=["channels_last", "transposed"])
@pytest.mark.parametrize("op", ["argmin", "argmax"])
def test_compiled_argreduce_of_a_non_contiguous_tensor_indexes_logically(op, make):
    """argmin/argmax over all dimensions of a non-contiguous tensor: Inductor computes logical
    indices for its C++ backend only when asked about the CPU; the patch
    inductor-argreduce-logical-index makes neuron inputs answer as CPU inputs do (the index was
    the memory-order one)."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    x = make(torch.randint(-1000, 1000, (2, 6, 2, 7), generator=torch.Generator().manual_seed(3)))
    torch._dynamo.reset()
    # not from the caches: kernels cached before the patch index in memory order
    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        got = torch.compile(lambda t: getattr(t, op)(), backend="neuron")(x.to(DEV))
    assert got.item() == getattr(x, op)().item()
