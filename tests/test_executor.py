"""The generic executor: operators queued after a meta pass (cached per argument
signature), results written through out= overloads, views, 64-bit types kept
exact, multi-output operators checked against their meta kernel, the
synchronous fallback for data-dependent sizes, errors raised at the next
synchronising call, and NEURON_LAUNCH_BLOCKING."""
import time

import pytest
import torch

from neuron_testing import SEED, run_python


def test_relu_runs_as_clamp_min_out_and_keeps_its_bool_error():
    # A queued relu writes into its output through clamp_min.out (the CPU
    # kernel's own definition); bool inputs still get relu's error.
    for dtype in (torch.float32, torch.float64, torch.int64, torch.int8, torch.bfloat16):
        x = (torch.randn(3, 5) * 10).to(dtype)
        for t in (x, x.t(), x[:, ::2]):
            want = torch.relu(t)
            got = torch.relu(t.to("neuron"))
            assert got.stride() == want.stride()
            assert torch.equal(got.cpu(), want)
    # raised at the call, with the CPU's exception
    with pytest.raises(RuntimeError, match="^Boolean inputs not supported for relu$"):
        torch.relu(torch.tensor([True, False], device="neuron"))


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


def test_64_bit_types_are_exact():
    big = torch.tensor([2**53 + 1, -(2**62) + 7, 123456789012345], dtype=torch.int64)
    assert torch.equal((big.neuron() * 3 - 5).cpu(), big * 3 - 5)
    x = torch.tensor([1e-300, 1.0 + 2**-52, 3.141592653589793], dtype=torch.float64)
    assert torch.equal((x.neuron() * 1.5).cpu(), x * 1.5)
    assert x.neuron().sum().item() == x.sum().item()


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


@pytest.mark.parametrize("op", ["_foreach_addcdiv_", "_foreach_addcmul_"])
def test_foreach_tensor_of_scalars_is_read_on_the_host_at_the_call(op):
    """The in-place foreach overloads taking their scalars as a 1-D CPU tensor
    read it at the call, as the CPU does: values bit for bit, a later change
    to the host tensor does not reach queued work, and the CPU's errors
    (integer division, a wrong length, a 2-D tensor, scalars on the device)
    come at the call with its message."""
    fn = getattr(torch, op)
    g = torch.Generator().manual_seed(SEED)

    def operands(device, dtype=torch.float32):
        return [[(torch.randn(n, generator=g) * 4 + 8).to(dtype).to(device) for n in (3, 70)] for _ in range(3)]

    def outcome(device, dtype, scalars):
        try:
            fn(*operands(device, dtype), scalars)
        except Exception as e:  # noqa: BLE001  (the type is what is compared)
            return type(e).__name__, str(e)
        return "ok"

    cpu = operands("cpu")
    dev = [[t.to("neuron") for t in ts] for ts in cpu]
    scalars = torch.tensor([0.5, -3.0])
    for ts in (cpu, dev):
        fn(*ts, scalars)
    scalars.fill_(100.0)  # after the neuron call returned; its work may still be queued
    for a, b in zip(dev[0], cpu[0]):
        assert torch.equal(a.cpu(), b)
    for dtype, scalars in [
        (torch.int16, torch.tensor([1, 2])),
        (torch.float32, torch.tensor([1.0, 2.0, 3.0])),
        (torch.float32, torch.ones(2, 1)),
    ]:
        want = outcome("cpu", dtype, scalars)
        assert want == "ok" if dtype is torch.int16 and op == "_foreach_addcmul_" else want != "ok"
        assert outcome("neuron", dtype, scalars) == want
    # Scalars on the device: refused as CUDA refuses its own.
    assert outcome("neuron", torch.float32, torch.ones(2, device="neuron")) == (
        "RuntimeError", "Expected scalars to be on CPU, got neuron:0 instead.")
    torch.neuron.synchronize()
    assert torch.neuron.device_errors()["total"] == 0  # nothing deferred


def test_multi_output_op_whose_meta_kernel_disagrees_queues_after_one_synchronous_call():
    # Batch norm in eval mode: the meta function promises saved statistics the
    # CPU kernel returns empty. The first call per argument pattern runs
    # synchronously and records what the CPU kernel did; later ones queue.
    from torchneuron import _python_tasks

    bn = torch.nn.BatchNorm2d(8).to("neuron").eval()
    x = torch.randn(4, 8, 16, 16, device="neuron")
    bn(x)
    _python_tasks.launch("sleep", [x], lambda _: time.sleep(0.5))
    y = bn(x)
    assert not torch.neuron.current_stream().query()  # bn did not wait for the sleeping task
    torch.testing.assert_close(y.cpu(), bn.cpu()(x.cpu()), rtol=0, atol=0)


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


def test_error_in_queued_op_is_raised_at_the_next_sync_naming_the_operator():
    x = torch.arange(10.0, device="neuron")
    torch.index_select(x, 0, torch.tensor([1, 2], device="neuron"))  # the kernel accepts these arguments
    bad = torch.tensor([1, 50], device="neuron")
    y = torch.index_select(x, 0, bad)  # queued: the bad index is only seen on the device
    with pytest.raises(IndexError, match=r"aten::index_select.*out of range"):
        y.cpu()  # the CPU kernel's exception type
    assert torch.neuron.reset_errors() != []  # sticky until reset (test_errors.py)
    assert (x + 1).sum().item() == 55


def test_launch_blocking_makes_each_op_synchronous():
    r = run_python(
        """
        import torch
        a = torch.randn(1024, 1024, device="neuron")
        b = a @ a
        print("done", torch.neuron.current_stream().query())
        torch.index_select(torch.ones(3, device="neuron"), 0, torch.tensor([1], device="neuron"))
        try:  # a call the device would otherwise queue
            torch.index_select(torch.ones(3, device="neuron"), 0, torch.tensor([7], device="neuron"))
        except IndexError as e:  # the CPU's exception type
            print("raised at launch:", "index_select" in str(e))
        """,
        env={"NEURON_LAUNCH_BLOCKING": "1"},
    )
    assert "done True" in r.stdout, r.stderr
    assert "raised at launch: True" in r.stdout, r.stderr



def test_meta_failures_are_classified_by_kind():
    """The executor tells a missing meta kernel (a property of the operator: it
    runs by the counted fallback, and its meta pass is not tried again) from
    outputs that depend on the data (index by a mask: it waits, as on every
    accelerator, and is no fallback). Pins the classification, so that a
    PyTorch upgrade that changes how meta passes fail breaks this test rather
    than quietly queuing less."""
    result = run_python("""
        import torch, torchneuron
        a, b = torch.rand(8, device="neuron") + 1, torch.rand(8, device="neuron") + 1
        for _ in range(3):
            got = torch.ops.aten._standard_gamma_grad(a, b)
        assert torch.equal(got.cpu(), torch.ops.aten._standard_gamma_grad(a.cpu(), b.cpu()))
        assert torchneuron.get_fallback_ops() == {"aten::_standard_gamma_grad": 3}
        x = torch.tensor([0.0, 3.0, 0.0, 1.0], device="neuron")
        for _ in range(2):
            assert x[x > 0].tolist() == [3.0, 1.0]
        assert torchneuron.get_fallback_ops() == {"aten::_standard_gamma_grad": 3}
    """, env={"TORCHNEURON_DEBUG_META": "1"}, timeout=300)
    assert result.returncode == 0, result.stderr
    # No meta kernel: tried once, then known, and warned about once. A mask
    # index: tried per call.
    assert result.stderr.count("meta pass of aten::_standard_gamma_grad failed") == 1, result.stderr
    assert result.stderr.count("aten::_standard_gamma_grad cannot be queued") == 1, result.stderr
    assert result.stderr.count("meta pass of aten::index failed") == 2, result.stderr


# A CPU tensor is an operand of a neuron call only when it is zero-dimensional
# (a scalar), as on CUDA, never an argument the call writes: CUDA raises
# RuntimeError for a CPU out= or self of an in-place operator, whatever its size.
CPU_WRITTEN = {
    "add out=": lambda s, o: torch.add(s, s, out=o),
    "nonzero out=": lambda s, o: torch.nonzero(s, out=o.long()),
    "ge out=": lambda s, o: torch.ge(s, s, out=o.bool()),
    "lgamma out=": lambda s, o: torch.lgamma(s, out=o),
    "igamma out=": lambda s, o: torch.igamma(s, s, out=o),
    "mul out= of the result's shape": lambda s, o: torch.mul(s, s, out=o.expand(3).clone()),
    "in-place self": lambda s, o: o.add_(s),
    "index_put_ self": lambda s, o: o.index_put_((), s),
}


@pytest.mark.parametrize("name", CPU_WRITTEN)
@pytest.mark.parametrize("dim", [0, 1])
def test_cpu_tensor_written_by_a_neuron_call_is_refused(name, dim):
    s = torch.full([3] if dim else [], 2.0, device="neuron")
    out = torch.full([], 7.0)
    with pytest.raises(RuntimeError, match="same device"):
        CPU_WRITTEN[name](s, out)
    assert out.item() == 7.0  # nothing written on the host


def test_cpu_scalar_operands_and_copies_to_the_host_stay_accepted():
    a = torch.arange(4.0)
    assert torch.equal(torch.add(a.to("neuron"), torch.tensor(2.0)).cpu(), torch.add(a, torch.tensor(2.0)))
    x = torch.zeros(4)
    x.index_put_((torch.tensor([1]),), torch.tensor(5.0))
    y = torch.zeros(4, device="neuron").index_put_((torch.tensor([1]),), torch.tensor(5.0))
    assert torch.equal(y.cpu(), x)
    host = torch.empty([])
    host.copy_(torch.tensor(3.0, device="neuron"))
    assert host.item() == 3.0


def test_a_cpu_scalar_operand_is_read_at_the_call_and_keeps_its_dtype_rules():
    # A zero-dimensional CPU tensor passed to a queued operator is taken by
    # value at the call, as a copy to the device would be: writing it after the
    # call, while the task still waits behind other work, changes nothing.
    # Its dtype takes part in type promotion as on the CPU (a float64 scalar
    # tensor leaves a float32 result float32; a float one makes an int result
    # float).
    g = torch.Generator().manual_seed(SEED)
    big = torch.randn(256, 256, device="neuron")
    for dtype, value in ((torch.float64, 2.5), (torch.float16, -1.5), (torch.int64, 3), (torch.bool, True),
                         (torch.int8, -7)):
        for x in (torch.randn(4, 3, generator=g) * 10, (torch.randn(4, 3, generator=g) * 10).to(torch.int32)):
            ops = (lambda t, s: t * s, lambda t, s: torch.add(t, s, alpha=2), lambda t, s: torch.maximum(t, s),
                   lambda t, s: t.clone().mul_(s) if torch.result_type(t, s) == t.dtype else t * s)
            for op in ops:
                s = torch.tensor(value, dtype=dtype)
                want = op(x, s)
                op(x.to("neuron"), s)  # the signature's first call runs synchronously
                big = big @ big / 256  # keeps the stream busy while the host writes s
                got = op(x.to("neuron"), s)
                s.fill_(0)
                assert got.dtype == want.dtype and torch.equal(got.cpu(), want), (dtype, x.dtype)


def test_every_out_variant_refuses_a_cpu_out():
    """Every OpInfo operator with out=, its first sample on neuron, a zero-dimensional CPU out."""
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.utils._pytree import tree_map

    refused, accepted = 0, []
    for op in op_db:
        if not op.supports_out or op.name in ("lu",):  # lu's out= is Python's copy_ to the host, as on CUDA
            continue
        try:
            sample = next(iter(op.sample_inputs("neuron", torch.float32)))
            expected = op(sample.input, *sample.args, **sample.kwargs)
        except Exception:  # noqa: BLE001 (no float32 sample, or it raises without out= too)
            continue
        if isinstance(expected, tuple):  # torch.return_types, which pytree does not open
            expected = tuple(expected)
        out = tree_map(lambda t: torch.full([], 7.0, dtype=t.dtype) if isinstance(t, torch.Tensor) else t, expected)
        try:
            op(sample.input, *sample.args, out=out, **sample.kwargs)
            torch.neuron.synchronize()
            accepted.append(op.name)
        except RuntimeError:
            refused += 1
        except TypeError:  # equal, histogramdd: out= not of that form
            pass
    assert refused > 300 and not accepted, (refused, accepted)


def _warnings_of(program, device):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = program(device)
    return result, [(w.category, str(w.message)) for w in caught]


RESIZED_OUTS = {  # a Python out wrapper, a C++ structured meta and a C++ composite kernel
    "add": lambda a, out: torch.add(a, a, out=out),
    "householder_product": lambda a, out: torch.linalg.householder_product(a, a[0], out=out),
    "cholesky": lambda a, out: torch.linalg.cholesky(a @ a.T + 3 * torch.eye(3, device=a.device), out=out),
}


@pytest.mark.parametrize("name", RESIZED_OUTS)
def test_a_resized_out_warns_once_as_on_the_cpu(name):
    """A non-empty out= of another size: the CPU kernel resizes it and warns once per call; the
    meta pass, which would warn too, sizes such outs from empty ones. An out of the right size,
    transposed, keeps its strides and queues."""
    import torchneuron

    a = torch.randn(3, 3, generator=torch.Generator().manual_seed(SEED), dtype=torch.float64)

    def program(device):
        outs = [torch.empty(2, 3, dtype=torch.float64, device=device) for _ in range(2)]
        for out in outs:  # the second call hits the meta cache
            RESIZED_OUTS[name](a.to(device), out)
        return [o.cpu() for o in outs]

    (cpu, cpu_warnings), (neuron, neuron_warnings) = _warnings_of(program, "cpu"), _warnings_of(program, "neuron")
    assert neuron_warnings == cpu_warnings and len(cpu_warnings) == 2
    assert all(torch.equal(n, c) for n, c in zip(neuron, cpu))

    torchneuron.clear_op_tracking()
    def sized(device):
        out = torch.empty(3, 3, dtype=torch.float64, device=device).t()
        RESIZED_OUTS[name](a.to(device), out)
        return out.stride(), out.cpu()

    (cpu_sized, none), (neuron_sized, also_none) = _warnings_of(sized, "cpu"), _warnings_of(sized, "neuron")
    assert none == also_none == []
    assert neuron_sized[0] == cpu_sized[0] and torch.equal(neuron_sized[1], cpu_sized[1])
    assert torchneuron.get_fallback_ops() == {}


def test_a_uint8_mask_index_is_data_dependent_not_a_fallback():
    """A uint8 index is a (deprecated) mask, as a bool one: it waits for the data like any mask
    index, with the CPU's deprecation warning only. (PyTorch's meta kernel of index refuses uint8,
    which the meta pass must not read as a stricter kernel: that would be a counted fallback and
    its "cannot be queued" warning, which the CPU never gives.)"""
    import torchneuron

    def program(device):
        v = torch.tensor([True, False, True], device=device)
        mask = torch.tensor([1, 0, 0], dtype=torch.uint8, device=device)
        x = torch.arange(12.0, device=device).view(3, 4)
        return [v[mask].cpu(), v[mask].cpu(), x[mask].cpu(), x[mask.bool()].cpu()]

    torchneuron.clear_op_tracking()
    (cpu, cpu_warnings), (neuron, neuron_warnings) = _warnings_of(program, "cpu"), _warnings_of(program, "neuron")
    assert neuron_warnings == cpu_warnings and len(cpu_warnings) == 3
    assert all(torch.equal(n, c) for n, c in zip(neuron, cpu))
    assert torchneuron.get_fallback_ops() == {}


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("index", [[1], 1], ids=["1-d", "0-d"])
def test_index_fill_refuses_a_cpu_index_as_cuda_does(in_place, index):
    """ATen's index_fill_ (CUDA's too) iterates the index restrided to self's rank, so a CPU index,
    even a zero-dimensional one, is never the CPU scalar TensorIterator lets a device kernel take:
    CUDA refuses it at the call, with TensorIterator's message, and so does neuron. The index on
    the device queues and fills as on the CPU."""
    import torchneuron

    torchneuron.clear_op_tracking()
    x = torch.arange(12.0, device="neuron").view(3, 4)
    with pytest.raises(RuntimeError, match=r"^Expected all tensors to be on the same device, but found at least "
                                            r"two devices, neuron:0 and cpu!$"):
        (x.index_fill_ if in_place else x.index_fill)(0, torch.tensor(index), -1.0)
    assert torch.equal(x.cpu(), torch.arange(12.0).view(3, 4))
    filled = x.index_fill(0, torch.tensor(index, device="neuron"), -1.0)
    assert torch.equal(filled.cpu(), torch.arange(12.0).view(3, 4).index_fill(0, torch.tensor(index), -1.0))
    assert torchneuron.get_fallback_ops() == {}


def test_index_fill_reads_a_cpu_scalar_value_at_the_call_and_queues():
    """A zero-dimensional CPU value is host data: ATen's index_fill_ (the CPU's and CUDA's) reads it at
    the call and fills with that number. So does neuron, on the queued path (PyTorch's Python meta
    function refuses a value on another device, which would make the call wait for the device), with
    no warning; the value is fixed when the call returns. Results, strides, gradients and errors as
    on the CPU; a value on the device queues too."""
    import warnings

    import torchneuron

    torchneuron.clear_op_tracking()
    idx = torch.tensor([2, 0])
    cases = ((torch.float32, -1.5), (torch.int64, 2.5), (torch.bool, True), (torch.complex64, 1 - 2j))
    for (dtype, number), dim, transposed in ((c, d, t) for c in cases for d in (0, 1) for t in (False, True)):
        x = torch.arange(12).view(3, 4).to(dtype)
        x = x.t().contiguous().t() if transposed else x
        value = torch.tensor(number)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = x.to("neuron").index_fill(dim, idx.to("neuron"), value)
            got_in_place = x.to("neuron")
            got_in_place.index_fill_(dim, idx.to("neuron"), value)
            on_device = x.to("neuron").index_fill(dim, idx.to("neuron"), value.to("neuron"))
        value.fill_(0)  # read at the call: no effect on what was queued
        want = x.index_fill(dim, idx, torch.tensor(number))
        for t in (got, got_in_place, on_device):
            assert torch.equal(t.cpu(), want) and t.stride() == want.stride(), (dtype, dim, transposed)
    assert torchneuron.get_fallback_ops() == {}

    def fill_grads(device):
        v = torch.tensor(1.5, requires_grad=True)
        x = torch.arange(12.0, device=device).view(3, 4).requires_grad_()
        weights = torch.arange(12.0, device=device).view(3, 4)
        (x.index_fill(1, idx.to(device), v) * weights).sum().backward()
        return v.grad, x.grad.cpu()
    assert all(torch.equal(a, b) for a, b in zip(fill_grads("neuron"), fill_grads("cpu")))

    for value, message in ((torch.tensor([5.0]), r"^index_fill_ only supports a 0-dimensional value tensor, "
                                                  r"but got tensor with 1 dimension\(s\)\.$"),
                           (torch.tensor(1j), r"^index_fill_\(\): Converting complex Scalar to non-complex type "
                                              r"is not supported$")):
        for device in ("cpu", "neuron"):
            x = torch.arange(12.0, device=device).view(3, 4)
            with pytest.raises(RuntimeError, match=message):
                x.index_fill(0, idx.to(device), value)
            with pytest.raises(RuntimeError, match=message):
                x.index_fill(0, idx.to(device), value.to(device))
            assert torch.equal(x.cpu(), torch.arange(12.0).view(3, 4))


def _scripted_index_writes(x, index):
    x[x < 50] = 1.0
    x[index] = -2.0
    x[index, None] += 0.5
    return x


def test_torchscript_index_writes_take_a_generic_list_of_optional_tensors():
    """TorchScript's interpreter, once it has profiled a graph (from its second call on), passes an
    index_put's `Tensor?[]` as a generic list of tensors and Nones; the call is taken as from eager
    code, result by result the CPU's."""
    scripted = torch.jit.script(_scripted_index_writes)
    index = torch.tensor([3, 60, 99])
    for _ in range(3):
        want = _scripted_index_writes(torch.arange(100.0), index)
        got = scripted(torch.arange(100.0, device="neuron"), index.to("neuron"))
        assert torch.equal(got.cpu(), want)
