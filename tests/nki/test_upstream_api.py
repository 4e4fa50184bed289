"""Each class of failure published kernels hit, with a kernel written here: nki.typing, the launch
and measurement entry points, masked reductions over inner free axes, kernels called from kernels,
torch_xla in alias mode, and the MX formats of NeuronCore-v4."""
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
import torchneuron.nki.typing as nt


# ------------------------------------------------------------------ nki.typing
@nki.jit
def annotated(a: nt.tensor[128, 512, nl.float32], b: nt.tensor) -> nt.tensor:
    out: nt.mutable_tensor = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t: nt.tensor[128, 512] = nl.load(a)
    nl.store(out, value=nl.add(t, nl.load(b)))
    return out


def test_typing_annotations_and_specs():
    a = np.arange(128 * 512, dtype=np.float32).reshape(128, 512)
    np.testing.assert_array_equal(annotated(a, a), 2 * a)
    spec = nt.tensor[[8192, 4096], nl.bfloat16]
    assert spec.shape == (8192, 4096) and spec.dtype == nl.bfloat16
    assert nt.tensor[128, 512].shape == (128, 512) and nt.tensor[128, 512].dtype is None
    assert nt.tensor[4, 8, "float16"].dtype == nl.float16
    z = nt.tensor[[2, 3], nl.int32].zeros()
    assert z.shape == (2, 3) and z.dtype == np.int32 and not z.any()
    import torchneuron.nki as pkg
    assert pkg.tensor is nki.NkiTensor          # beta-1 ``nki.tensor`` annotations


# ------------------------------------------------------ launch entry points
def test_simulate_simulate_kernel_baremetal_and_jit_modes():
    a = np.random.default_rng(0).standard_normal((128, 512)).astype(np.float32)

    def plain(x, y):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(x) * nl.load(y))
        return out

    expected = a * a
    np.testing.assert_array_equal(nki.simulate(plain)(a, a), expected)          # plain function
    np.testing.assert_array_equal(nki.simulate(nki.jit(plain))(a, a), expected)
    np.testing.assert_array_equal(nki.simulate_kernel(nki.jit(plain), a, a), expected)
    np.testing.assert_array_equal(nki.baremetal()(plain)(a, a), expected)
    np.testing.assert_array_equal(nki.baremetal(plain)(a, a), expected)
    np.testing.assert_array_equal(nki.jit(mode="simulation")(plain)(a, a), expected)
    np.testing.assert_array_equal(nki.jit(plain, additional_compile_opt="-O1")(a, a), expected)

    @nki.jit
    def two_cores(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        rows = x.shape[0] // nl.num_programs(0)
        i = nl.program_id(0)
        nl.store(out[i * rows:(i + 1) * rows, :], value=nl.load(x[i * rows:(i + 1) * rows, :]) + float(i))
        return out
    got = nki.simulate(two_cores[2])(a)                        # NKI 0.x: kernel[lnc]
    np.testing.assert_array_equal(got, a + np.repeat([0.0, 1.0], 64)[:, None].astype(np.float32))


def test_simulate_returns_torch_tensors_for_torch_tensors():
    torch = pytest.importorskip("torch")

    @nki.jit
    def double(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(x) * 2.0)
        return out
    x = torch.arange(128 * 8, dtype=torch.float32).reshape(128, 8)
    y = nki.simulate(double)(x)
    assert isinstance(y, torch.Tensor) and torch.equal(y, x * 2)


# ------------------------------------------ masked reductions over free axes
@nki.jit
def max_pool_3x3(x):
    """Stride-1 3x3 max pooling over rows of a (h, w) image, 128 rows per tile, ragged last tile."""
    h, w = x.shape
    k = 3
    out = nl.ndarray((h - 2, w - 2), dtype=x.dtype, buffer=nl.shared_hbm)
    for t in nl.affine_range((h + 127) // 128):
        r, kr, c = nl.mgrid[0:128, 0:k, 0:w]
        rows = t * 128 + r
        win = nl.load(x[rows + kr, c], mask=(rows < h - 2))
        r, kr, c, kc = nl.mgrid[0:128, 0:k, 0:w - 2, 0:k]
        # a (128, 3, w-2, 3) window reduced over axes 1 and 3, the mask built on the window grid
        m = nl.max(win[r, kr, c + kc], axis=[1, 3], mask=(t * 128 + r < h - 2))
        orow, ocol = nl.mgrid[0:128, 0:w - 2]
        nl.store(out[t * 128 + orow, ocol], value=m, mask=(t * 128 + orow < h - 2))
    return out


def test_mask_of_a_reduction_over_inner_free_axes():
    x = np.random.default_rng(2).standard_normal((150, 40)).astype(np.float32)
    expected = np.max(np.lib.stride_tricks.sliding_window_view(x, (3, 3)), axis=(2, 3))
    np.testing.assert_array_equal(max_pool_3x3(x), expected)


@nki.jit
def masked_softmax_rows(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    i = nl.arange(128)[:, None]
    j = nl.arange(x.shape[1])[None, :]
    t = nl.load(x[i, j], mask=(i < x.shape[0]))
    mx = nl.max(t, axis=[1], keepdims=True, mask=(i < x.shape[0]))      # (128, 1) from a (128, n) mask
    e = nl.exp(nl.subtract(t, mx, mask=(i < x.shape[0])))
    nl.store(out[i, j], value=e / nl.sum(e, axis=[1]), mask=(i < x.shape[0]))
    return out


def test_mask_of_a_keepdims_reduction():
    x = np.random.default_rng(3).standard_normal((5, 7)).astype(np.float32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(masked_softmax_rows(x), e / e.sum(axis=1, keepdims=True), rtol=1e-6)


# ------------------------------------------------- kernels calling kernels
@nki.jit
def scale_tile(t, out_tile, factor):
    out_tile[...] = nl.multiply(t, factor)


@nki.jit
def calls_a_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    s = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    scale_tile(t, s, 3.0)            # runs inline, on this kernel's tiles
    nl.store(out, value=s)
    return out


def test_a_kernel_called_from_a_kernel_runs_inline():
    x = np.random.default_rng(4).standard_normal((64, 32)).astype(np.float32)
    np.testing.assert_allclose(calls_a_kernel(x), 3 * x, rtol=1e-6)
    info = calls_a_kernel.cache_info()
    assert info["signatures"] == 1 and not info["unreplayable"]     # one trace: the call is inline
    np.testing.assert_allclose(calls_a_kernel(x + 1), 3 * (x + 1), rtol=1e-6)
    assert calls_a_kernel.cache_info()["replays"] == 1


# ---------------------------------------------------- torch_xla, alias mode
def test_torch_xla_in_alias_mode_gives_the_neuron_device(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torchneuron.nki
        assert "torch_xla" not in sys.modules
        torchneuron.nki.install_import_aliases()
        import torch
        import torch_xla
        from torch_xla.core import xla_model as xm
        import neuronxcc.nki as nki
        import neuronxcc.nki.language as nl

        @nki.jit
        def add(a, b):
            out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
            nl.store(out, value=nl.load(a) + nl.load(b))
            return out

        device = xm.xla_device()
        assert device.type == "neuron" and torch_xla.device().type == "neuron"
        a = torch.rand((128, 64), dtype=torch.bfloat16).to(device=device)
        b = torch.rand((128, 64), dtype=torch.bfloat16).to(device=device)
        xm.mark_step()
        c = add(a, b)
        xm.mark_step()
        assert c.device.type == "neuron"
        assert torch.equal(c.cpu(), (a.cpu() + b.cpu()))
        torchneuron.nki.uninstall_import_aliases()
        assert "torch_xla" not in sys.modules and "nki" not in sys.modules
        print("ok")
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                       cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": ":".join(sys.path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")


# ------------------------------------------------------ MX (NeuronCore-v4)
def _reference_mx_matmul(st_vals, st_scale, mv_vals, mv_scale):
    """Dequantise [K, F, 4] values with per-(8 partitions, column) scales and contract over (K, 4)."""
    def deq(v, s):
        rows = (np.arange(v.shape[0]) // 32) * 32 + (np.arange(v.shape[0]) % 32) // 8
        return v * np.exp2(s[rows].astype(np.float64) - 127)[:, :, None]
    s, m = deq(st_vals, st_scale), deq(mv_vals, mv_scale)
    return np.einsum("kmq,knq->mn", s, m)


@nki.jit(platform_target="trn3")
def quantize_and_matmul(st_bf16, mv_bf16, dtype):
    """Both operands quantized on the device ([K, 4F] bf16 with each group of 4 along the free axis
    one packed element), then one MX matmul."""
    k, f_st = st_bf16.shape
    _, f_mv = mv_bf16.shape
    st = nl.ndarray(st_bf16.shape, dtype=st_bf16.dtype, buffer=nl.sbuf)
    mv = nl.ndarray(mv_bf16.shape, dtype=mv_bf16.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=st, src=st_bf16)
    nisa.dma_copy(dst=mv, src=mv_bf16)
    st_q = nl.ndarray((k, f_st // 4), dtype=dtype, buffer=nl.sbuf)
    mv_q = nl.ndarray((k, f_mv // 4), dtype=dtype, buffer=nl.sbuf)
    st_s = nl.ndarray((k, f_st // 4), dtype=nl.uint8, buffer=nl.sbuf)
    mv_s = nl.ndarray((k, f_mv // 4), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.quantize_mx(dst=st_q, src=st, dst_scale=st_s)
    nisa.quantize_mx(dst=mv_q, src=mv, dst_scale=mv_s)
    acc = nl.ndarray((f_st // 4, f_mv // 4), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=acc, stationary=st_q, moving=mv_q, stationary_scale=st_s, moving_scale=mv_s)
    res = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    out = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    q = nl.ndarray((k, f_mv // 4), dtype=dtype, buffer=nl.shared_hbm)
    s = nl.ndarray((k, f_mv // 4), dtype=nl.uint8, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=q, src=mv_q)
    nisa.dma_copy(dst=s, src=mv_s)
    return out, q, s


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_quantize_mx_and_matmul_mx(name):
    rng = np.random.default_rng(5)
    k, m, n = 64, 32, 128
    st = rng.standard_normal((k, 4 * m)).astype(ml_dtypes.bfloat16)
    mv = (rng.standard_normal((k, 4 * n)) * np.exp2(rng.integers(-6, 6, (k, 1)))).astype(ml_dtypes.bfloat16)
    dtype = getattr(nl, name + "_x4")
    out, q, s = quantize_and_matmul(st, mv, dtype)
    elem = getattr(ml_dtypes, name)
    emax = {"float8_e4m3fn": 8, "float8_e5m2": 15}[name]
    # the scales: 2**(floor(log2 amax) - (emax - 1)) per group of 8 partitions x 4 values, biased by 127,
    # in rows (p // 32) * 32 + (p % 32) // 8
    v = mv.astype(np.float32)
    amax = np.abs(v).reshape(k // 8, 8, n, 4).max(axis=(1, 3))
    expected_bias = np.floor(np.log2(amax)).astype(int) - (emax - 1) + 127
    rows = (np.arange(0, k, 8) // 32) * 32 + (np.arange(0, k, 8) % 32) // 8
    np.testing.assert_array_equal(s[rows].astype(int), expected_bias)
    # the values: v / scale rounded to the element type, four per 32-bit element, lowest byte first
    scale = np.exp2(np.repeat(expected_bias - 127, 8, axis=0)).astype(np.float32)
    want = (v.reshape(k, n, 4) / scale[:, :, None]).astype(elem)
    got = q.view(np.uint8).reshape(k, n, 4).view(elem)
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
    # the matmul of the quantized operands, dequantised
    st_vals = (st.astype(np.float32).reshape(k, m, 4))
    st_amax = np.abs(st_vals).reshape(k // 8, 8, m, 4).max(axis=(1, 3))
    st_bias = np.floor(np.log2(st_amax)).astype(int) - (emax - 1) + 127
    st_q = (st_vals / np.exp2(np.repeat(st_bias - 127, 8, axis=0))[:, :, None]).astype(elem).astype(np.float64)
    st_scale = np.zeros((k, m), np.int64)
    st_scale[rows] = st_bias
    mv_scale = np.zeros((k, n), np.int64)
    mv_scale[rows] = expected_bias
    ref = _reference_mx_matmul(st_q, st_scale, want.astype(np.float64), mv_scale)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    # and close to the unquantized product
    exact = np.einsum("kmq,knq->mn", st_vals, v.reshape(k, n, 4))
    assert np.abs(out - exact).max() < 0.1 * np.abs(exact).max()


@nki.jit
def packed_fp4_matmul(st_bytes, st_scale, mv_bytes, mv_scale):
    """Offline-quantized MXFP4 operands: bytes in HBM viewed as packed fp4 through .ap(dtype=)."""
    k = st_bytes.shape[0]
    m, n = st_bytes.shape[1] // 2, mv_bytes.shape[1] // 2
    st_hbm = st_bytes.ap(pattern=[[m, k], [1, m]], dtype=nl.float4_e2m1fn_x4)
    mv_hbm = mv_bytes.ap(pattern=[[n, k], [1, n]], dtype=nl.float4_e2m1fn_x4)
    st = nl.ndarray((k, m), dtype=nl.float4_e2m1fn_x4, buffer=nl.sbuf)
    mv = nl.ndarray((k, n), dtype=nl.float4_e2m1fn_x4, buffer=nl.sbuf)
    nisa.dma_copy(dst=st, src=st_hbm)
    nisa.dma_copy(dst=mv, src=mv_hbm)
    ss = nl.ndarray(st_scale.shape, dtype=nl.uint8, buffer=nl.sbuf)
    ms = nl.ndarray(mv_scale.shape, dtype=nl.uint8, buffer=nl.sbuf)
    nisa.dma_copy(dst=ss, src=st_scale)
    nisa.dma_copy(dst=ms, src=mv_scale)
    acc = nl.ndarray((m, n), dtype=nl.bfloat16, buffer=nl.psum)
    nisa.nc_matmul_mx(acc, st, mv, ss, ms)
    res = nl.ndarray((m, n), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    out = nl.ndarray((m, n), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_mxfp4_from_bytes_and_the_v3_refusal(monkeypatch):
    rng = np.random.default_rng(6)
    k, m, n = 32, 16, 64
    fp4_values = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
    st_vals = rng.choice(fp4_values, (k, m, 4)) * rng.choice([-1, 1], (k, m, 4))
    mv_vals = rng.choice(fp4_values, (k, n, 4)) * rng.choice([-1, 1], (k, n, 4))

    def to_bytes(vals):
        nib = vals.astype(np.float32).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
        flat = nib.reshape(vals.shape[0], -1)
        return (flat[:, 0::2] | (flat[:, 1::2] << 4)).astype(np.uint8)    # two per byte, low nibble first
    st_scale = rng.integers(120, 130, (k // 8, m)).astype(np.uint8)       # P <= 32: contiguous rows
    mv_scale = rng.integers(120, 130, (k // 8, n)).astype(np.uint8)
    monkeypatch.setenv("TORCHNEURON_MACHINE", "trn3")
    out = packed_fp4_matmul(to_bytes(st_vals), st_scale, to_bytes(mv_vals), mv_scale)
    ref = _reference_mx_matmul(st_vals, st_scale, mv_vals, mv_scale)
    np.testing.assert_allclose(out.astype(np.float32), ref.astype(ml_dtypes.bfloat16).astype(np.float32),
                               rtol=1e-2)
    monkeypatch.setenv("TORCHNEURON_MACHINE", "trn2")
    with pytest.raises(nki.NKITypeError, match="only on NeuronCore-v4"):
        packed_fp4_matmul(to_bytes(st_vals), st_scale, to_bytes(mv_vals), mv_scale)


# ------------------------------------------------------- smaller API names
@nki.jit
def small_names(x, ints):
    out = nl.ndarray((6,) + x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    neg = nl.negative(t)
    nl.store(out[0], value=nl.abs_max(t, nl.multiply(neg, 0.5)))
    nl.store(out[1], value=nl.abs_min(t, nl.multiply(neg, 0.5)))
    nl.store(out[2], value=nl.gelu_apprx_sigmoid_dx(t))
    nl.store(out[3], value=nl.rms_norm(t, nl.load(x[0:1, :]).broadcast_to(x.shape), axis=1, n=x.shape[1]))
    r = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=r, op=nl.bypass, data=t, scale=2.0)
    nl.store(out[4], value=r)
    eye = nl.ndarray((x.shape[0], x.shape[0]), dtype=nl.float32, buffer=nl.sbuf)
    nl.shared_identity_matrix(x.shape[0], dtype=nl.float32, dst=eye)
    nl.store(out[5][:, 0:x.shape[0]], value=eye)
    nl.store(out[5][:, x.shape[0]:], value=nl.zeros((x.shape[0], x.shape[1] - x.shape[0]), dtype=nl.float32))
    inv = nl.ndarray(ints.shape, dtype=ints.dtype, buffer=nl.shared_hbm)
    with nl.no_reorder():
        for i in nl.dynamic_range(1):
            nl.store(inv, value=nl.invert(nl.load(ints)))
    assert nl.is_sbuf(t) and nl.is_psum(nl.psum) and nl.is_hbm(x) and not nl.is_on_chip(x)
    return out, inv


def test_smaller_api_names():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((16, 32)).astype(np.float32)
    ints = rng.integers(-100, 100, (16, 8)).astype(np.int32)
    out, inv = small_names(x, ints)
    y = -0.5 * x
    np.testing.assert_array_equal(out[0], np.where(np.abs(x) >= np.abs(y), x, y))
    np.testing.assert_array_equal(out[1], np.where(np.abs(x) <= np.abs(y), x, y))
    s = 1 / (1 + np.exp(-1.702 * x))
    np.testing.assert_allclose(out[2], s * (1 + 1.702 * x * (1 - s)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[3], x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6) * x[0:1], rtol=1e-5)
    np.testing.assert_array_equal(out[4], 2 * x)
    np.testing.assert_array_equal(out[5][:, :16], np.eye(16))
    np.testing.assert_array_equal(out[5][:, 16:], 0)
    np.testing.assert_array_equal(inv, ~ints)
    assert nisa.get_nc_sub_version() == 0 and nisa.matmul_perf_mode.double_row.value == "double_row"


def test_exponential_on_v4(monkeypatch):
    @nki.jit(platform_target="trn3")
    def softmax_numerator(x):
        t = nl.load(x)
        mx = nisa.tensor_reduce(np.max, t, axis=1, keepdims=True)
        e = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.exponential(dst=e, src=t, max_value=mx, reduce_res=s)
        out = nl.ndarray((2,) + x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[0], value=e)
        nl.store(out[1], value=s.broadcast_to(x.shape))
        return out
    x = np.random.default_rng(9).standard_normal((8, 16)).astype(np.float32)
    out = softmax_numerator(x)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out[0], e, rtol=1e-6)
    np.testing.assert_allclose(out[1], np.broadcast_to(e.sum(axis=1, keepdims=True), x.shape), rtol=1e-5)
