"""The lean path: small `+ - * /`, relu, sum, cat, `x[index]`, mm and addmm run
without a meta pass, bit for bit the CPU's; calls it does not take go to the
generic executor and agree too."""
import re

import pytest
import torch
import torchneuron


def test_small_same_shape_elementwise_ops_take_the_lean_path_and_match_cpu():
    # add, sub, mul, div, relu and sum on small contiguous operands of one
    # shape and dtype run without a meta pass (csrc/bridge/ops/lean_path.cpp):
    # new shapes add no meta-cache entry. Results, dtypes and strides are the
    # CPU's, bit for bit; other calls take the generic path and agree too.
    ops = {
        "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "div": lambda a, b: a / b, "relu": lambda a, b: torch.relu(a),
        "add_alpha": lambda a, b: torch.add(a, b, alpha=2),
        "sum": lambda a, b: a.sum(), "sum_double": lambda a, b: a.sum(dtype=torch.float64),
    }
    dtypes = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32,
              torch.uint8, torch.bool)
    g = torch.Generator().manual_seed(0)

    def check(a, b):
        for name, op in ops.items():
            try:
                want = op(a, b)
            except RuntimeError as e:
                with pytest.raises(RuntimeError, match=re.escape(str(e).split("\n")[0][:40])):
                    op(a.to("neuron"), b.to("neuron"))
                    torch.neuron.synchronize()
                continue
            got = op(a.to("neuron"), b.to("neuron"))
            assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride(), name
            bits = lambda t: t.reshape(-1).view(torch.uint8)  # noqa: E731 (NaN payloads, signed zeros)
            assert torch.equal(bits(got.cpu()), bits(want)), (name, a.dtype)

    for dtype in dtypes:
        for shape in ((), (7,), (3, 5), (2, 1, 4), (0, 3), (3, 5, 7)):
            a = (torch.randn(shape, generator=g) * 10).to(dtype)
            b = (torch.randn(shape, generator=g) * 10).to(dtype)
            if dtype.is_floating_point and a.numel():
                a.view(-1)[0] = float("nan")
            check(a, b)
    # New shapes on the lean path add no meta-cache entry; a broadcast does.
    torch.neuron.synchronize()
    for dtype, names in ((torch.float32, ("add", "sub", "mul", "div", "relu", "sum")), (torch.int64, ("add", "mul"))):
        a, b = torch.ones(6, 11, dtype=dtype, device="neuron"), torch.ones(6, 11, dtype=dtype, device="neuron")
        entries = torchneuron._C._meta_cache_entries()
        for name in names:
            ops[name](a, b)
        assert torchneuron._C._meta_cache_entries() == entries, dtype
    a, b = torch.ones(6, 13, device="neuron"), torch.ones(1, 13, device="neuron")
    entries = torchneuron._C._meta_cache_entries()
    a + b
    assert torchneuron._C._meta_cache_entries() > entries
    # Broadcasting, type promotion, strided views (of device tensors) and CPU
    # scalars: the generic path.
    x = torch.randn(4, 6, generator=g)
    xn = x.to("neuron")
    for operands in (lambda t: (t, t[:1]), lambda t: (t, t.double()), lambda t: (t.t(), t.t()),
                     lambda t: (t[:, ::2], t[:, 1::2]), lambda t: (t, torch.tensor(3.0))):
        for name in ("add", "sub", "mul", "div", "relu", "sum"):
            want = ops[name](*operands(x))
            got = ops[name](*operands(xn))
            assert got.dtype == want.dtype and got.stride() == want.stride()
            assert torch.equal(got.cpu(), want), name


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_small_tensor_and_python_number_take_the_lean_path_and_match_cpu():
    # `a * 0.999`, `a + 2`, `a - True`, `a / 3`: the number reaches the kernel
    # as the wrapped CPU tensor PyTorch made of it, taken by value at the call.
    # When the result keeps the tensor's dtype the call skips the meta pass
    # (no meta-cache entry for new shapes); otherwise (an int tensor times a
    # float, a complex number) it takes the generic path. Both agree with the
    # CPU bit for bit, with its dtypes, strides and errors.
    ops = {"add": lambda a, s: a + s, "radd": lambda a, s: s + a, "sub": lambda a, s: a - s,
           "mul": lambda a, s: a * s, "rmul": lambda a, s: s * a, "div": lambda a, s: a / s,
           "add_alpha": lambda a, s: torch.add(a, s, alpha=2)}
    numbers = (0.999, 1 / 3, -0.0, 1e-40, 3.4028235e38 * 1.0000001, 1e30, float("nan"), -3, True, 2 ** 40, 1.5 - 2j)
    bits = lambda t: t.reshape(-1).view(torch.uint8)  # noqa: E731 (NaN payloads, signed zeros)
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32,
                  torch.uint8, torch.bool, torch.complex64):
        for shape in ((), (8,), (3, 5), (2, 1, 4), (0, 3)):
            a = (torch.randn(shape, generator=g) * 10).to(dtype)
            if dtype.is_floating_point and a.numel():
                a.view(-1)[0] = float("nan")
            for s in numbers:
                for name, op in ops.items():
                    try:
                        want = op(a, s)
                    except RuntimeError as e:
                        with pytest.raises(RuntimeError, match=re.escape(str(e).split("\n")[0][:40])):
                            op(a.to("neuron"), s)
                            torch.neuron.synchronize()
                        continue
                    got = op(a.to("neuron"), s)
                    assert got.dtype == want.dtype and got.shape == want.shape, (name, dtype, s)
                    assert got.stride() == want.stride(), (name, dtype, s)
                    assert torch.equal(bits(got.cpu()), bits(want)), (name, dtype, s)
    torch.neuron.synchronize()
    a, i = torch.ones(6, 17, device="neuron"), torch.ones(6, 17, dtype=torch.int64, device="neuron")
    entries = torchneuron._C._meta_cache_entries()
    for name in ("add", "sub", "mul", "div"):
        ops[name](a, 0.5)
    ops["mul"](i, 3)
    assert torchneuron._C._meta_cache_entries() == entries
    ops["mul"](i, 0.5)  # promotes: generic
    assert torchneuron._C._meta_cache_entries() > entries
    # A dependent chain, as optimizer code runs it: the CPU's bits.
    x, b = torch.randn(8, generator=g), torch.randn(8, generator=g)
    xn, bn = x.to("neuron"), b.to("neuron")
    for _ in range(100):
        x, xn = x * 0.999 + b, xn * 0.999 + bn
    assert torch.equal(xn.cpu(), x)


def test_small_cat_of_contiguous_tensors_takes_the_lean_path_and_matches_cpu():
    # cat of small contiguous tensors of one dtype with up to three dimensions
    # is a copy of rows made by the task itself (csrc/bridge/ops/lean_path.cpp):
    # no meta pass, so new shapes add no meta-cache entry. Results are the
    # CPU's; anything else takes the generic path and agrees too.
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.int64, torch.bool, torch.bfloat16):
        a = (torch.randn(3, 4, 5, generator=g) * 10).to(dtype)
        cases = [([a.narrow(d, 0, 2).contiguous(), a.narrow(d, 1, 1).contiguous(), a], d) for d in (0, 1, 2, -1, -3)]
        cases += [([a[0], a[1]], 0), ([a.reshape(-1), a.reshape(-1)[:0]], 0), ([a], 1), ([a[:0], a], 0)]
        cases += [([a, a.transpose(0, 1).contiguous().transpose(0, 1)], 2),  # strided: generic
                  ([a.reshape(3, 4, 5, 1), a.reshape(3, 4, 5, 1)], 3),  # 4-D: generic
                  ([a, a.double()], 0)]  # promotion: generic
        torch.neuron.synchronize()
        for parts, dim in cases:
            want = torch.cat(parts, dim)
            got = torch.cat([p.to("neuron") for p in parts], dim)
            assert got.dtype == want.dtype and got.stride() == want.stride(), (dtype, dim)
            assert torch.equal(got.cpu(), want), (dtype, dim)
    parts = [torch.ones(2, 7, 3, device="neuron"), torch.zeros(2, 1, 3, device="neuron")]
    entries = torchneuron._C._meta_cache_entries()
    assert torch.equal(torch.cat(parts, 1).cpu(), torch.cat([p.cpu() for p in parts], 1))
    assert torchneuron._C._meta_cache_entries() == entries
    with pytest.raises(RuntimeError, match="same number of dimensions"):
        torch.cat([torch.ones(2, device="neuron"), torch.ones(2, 3, device="neuron")])
    with pytest.raises(RuntimeError, match="same device"):
        torch.cat([torch.ones(2, device="neuron"), torch.ones(2)])


def test_small_index_by_an_int64_tensor_takes_the_lean_path_and_matches_cpu():
    # x[i] for a small contiguous x and one contiguous int64 index on the
    # device is a copy of rows made by the task (csrc/bridge/ops/lean_path.cpp):
    # no meta pass. Results are the CPU's, bit for bit; an index out of bounds
    # raises the CPU's message at the next synchronising call, without the
    # executor's C++ backtrace. Masks, several indices, CPU or int32 indices,
    # strided tensors and large results take the generic path and agree too.
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.float64):
        for shape, index_shape in (((8,), (4,)), ((8, 3), (2, 2)), ((5, 2, 3), (7,)), ((6, 0), (2,)),
                                   ((0, 3), (0,)), ((3, 4), (0, 2)), ((1,), (5,))):
            x = (torch.randn(shape, generator=g) * 10).to(dtype)
            i = torch.randint(-shape[0], max(shape[0], 1), index_shape, generator=g)
            xn, i_n = x.to("neuron"), i.to("neuron")
            cases = [(x[i], xn[i_n])]
            if x.dim() >= 2 and x.shape[1] > 0:
                j, j_n = i % x.shape[1], i_n % x.shape[1]
                cases += [(x.transpose(0, 1)[j], xn.transpose(0, 1)[j_n]), (x[i, j], xn[i_n, j_n])]
            cases += [(x[x.bool()], xn[xn.bool()]), (x[i.int()], xn[i_n.int()]), (x[i], xn[i])]
            for want, got in cases:
                assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
                assert torch.equal(got.cpu(), want), (dtype, shape, index_shape)
    torch.neuron.synchronize()
    x, i = torch.randn(9, 4, device="neuron"), torch.tensor([[2, -1], [0, 8]], device="neuron")
    entries = torchneuron._C._meta_cache_entries()
    assert torch.equal(x[i].cpu(), x.cpu()[i.cpu()])
    assert torchneuron._C._meta_cache_entries() == entries
    # A result of 1M elements or more goes to ATen's kernel (every thread).
    wide, rows = torch.randn(4, 300_000, device="neuron"), torch.tensor([0, 3, -1, 2, 0], device="neuron")
    assert torch.equal(wide[rows].cpu(), wide.cpu()[rows.cpu()])
    assert torchneuron._C._meta_cache_entries() > entries
    bad = x[torch.tensor([1, 9, -10], device="neuron")]  # queued; the device finds the index
    with pytest.raises(IndexError, match=r"aten::index.*index 9 is out of bounds for dimension 0 with size 9\n"):
        torch.neuron.synchronize()  # the CPU kernel's exception type
    torch.neuron.reset_errors()
    del bad
    # A result with no elements checks no index, as on the CPU; a tensor with
    # no rows has no index in bounds.
    empty = torch.ones(9, 0, device="neuron")[torch.tensor([12], device="neuron")]
    assert empty.shape == (1, 0)
    torch.neuron.synchronize()
    with pytest.raises(IndexError, match=r"index is out of bounds for dimension with size 0"):
        # empty: the generic path, whose first call of a signature raises the CPU's error at the call
        torch.ones(0, 3, device="neuron")[torch.tensor([0], device="neuron")]
        torch.neuron.synchronize()
    torch.neuron.reset_errors()


def test_small_matrix_products_take_the_lean_path_and_match_cpu():
    # mm and addmm of small matrices stored row-major or transposed (a Linear
    # layer's x @ w.t()) run the CPU kernel on aliases of the same layouts
    # (csrc/bridge/ops/lean_path.cpp): bit for bit the CPU's gemm, with no
    # meta pass. Other calls (scaled, broadcast bias, strided) agree too.
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    bits = lambda t: t.reshape(-1).view(torch.uint8)  # noqa: E731
    cases = {
        "mm": lambda a, w, b, c: a @ w.t().contiguous(),
        "mm_transposed": lambda a, w, b, c: a @ w.t(),
        "mm_both_transposed": lambda a, w, b, c: a.t().contiguous().t() @ w.t(),
        "linear": lambda a, w, b, c: F.linear(a, w, b),
        "addmm_full_bias": lambda a, w, b, c: torch.addmm(c, a, w.t()),
        "addmm_scaled": lambda a, w, b, c: torch.addmm(c, a, w.t(), beta=0.5, alpha=2),
        "addmm_column_bias": lambda a, w, b, c: torch.addmm(c[:, :1], a, w.t()),
        "mm_strided": lambda a, w, b, c: a[:, ::2] @ w[:, ::2].t(),
    }
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for m, k, n in ((16, 16, 16), (1, 7, 3), (5, 1, 9), (0, 4, 3), (3, 0, 2), (33, 18, 65)):
            cpu = [torch.randn(shape, generator=g).to(dtype) for shape in ((m, k), (n, k), (n,), (m, n))]
            dev = [t.to("neuron") for t in cpu]
            for name, f in cases.items():
                want, got = f(*cpu), f(*dev)
                assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride(), name
                assert torch.equal(bits(got.cpu()), bits(want)), (name, dtype, (m, k, n))
    # New shapes add no meta-cache entry; errors are the CPU's.
    torch.neuron.synchronize()
    x, w, b = (torch.randn(s, device="neuron") for s in ((7, 9), (5, 9), (5,)))
    entries = torchneuron._C._meta_cache_entries()
    F.linear(x, w, b), x @ w.t()
    assert torchneuron._C._meta_cache_entries() == entries
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        x @ w
    with pytest.raises(RuntimeError, match="same device"):
        x @ torch.randn(9, 2)

