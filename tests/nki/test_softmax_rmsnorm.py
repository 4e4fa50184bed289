"""Softmax and RMSNorm over ragged row counts, with mask= predicates (beta 1)
and min-bounded slices (NKI 0.x)."""
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


@nki.jit
def softmax_rows(x):
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    ip = nl.arange(128)[:, None]
    jf = nl.arange(d)[None, :]
    for t in nl.affine_range((n + 127) // 128):
        rows = t * 128 + ip
        live = rows < n                                     # ragged last tile
        xt = nl.load(x[rows, jf], mask=live)
        m = nl.max(xt, axis=1, mask=live)
        e = nl.exp(nl.subtract(xt, m, mask=live), mask=live)
        s = nl.sum(e, axis=1, mask=live)
        nl.store(out[rows, jf], value=nl.divide(e, s, mask=live), mask=live)
    return out


@nki.jit
def rmsnorm_rows(x, w, eps):
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    ip = nl.arange(128)[:, None]
    jf = nl.arange(d)[None, :]
    w_t = nl.load(w.reshape((1, d))[nl.arange(1)[:, None], jf])
    for t in nl.affine_range((n + 127) // 128):
        rows = t * 128 + ip
        xt = nl.load(x[rows, jf], mask=(rows < n))
        ms = nl.mean(nl.square(xt, mask=(rows < n)), axis=1, mask=(rows < n))
        r = nl.rsqrt(ms + eps, mask=(rows < n))
        y = nl.multiply(nl.multiply(xt, r), w_t.broadcast_to((128, d)), mask=(rows < n))
        nl.store(out[rows, jf], value=y, mask=(rows < n))
    return out


@nki.jit
def rmsnorm_nki0(x, w, eps):
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    w_t = nl.ndarray((128, d), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=w_t, src=w.ap([[0, 128], [1, d]]))  # broadcast w to all partitions
    for t in range((n + 127) // 128):
        r0 = t * 128
        rows = min(128, n - r0)                             # min-bounded last tile
        xt = nl.ndarray((128, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt[0:rows, :], src=x[r0:r0 + rows, :])
        sq = nl.ndarray((128, d), dtype=nl.float32, buffer=nl.sbuf)
        ss = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=sq[0:rows], op=nl.square, data=xt[0:rows], reduce_op=nl.add, reduce_res=ss[0:rows])
        rs = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=rs[0:rows], data=ss[0:rows], op0=np.multiply, operand0=1.0 / d,
                           op1=np.add, operand1=eps)
        nisa.activation(dst=rs[0:rows], op=nl.rsqrt, data=rs[0:rows])
        y = nl.ndarray((128, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=y[0:rows], data=xt[0:rows], op0=np.multiply, operand0=rs[0:rows],
                                  op1=np.multiply, operand1=w_t[0:rows])
        nisa.dma_copy(dst=out[r0:r0 + rows, :], src=y[0:rows])
    return out


def softmax_ref(x):
    x = x.astype(np.float32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def rmsnorm_ref(x, w, eps):
    x = x.astype(np.float32)
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * w.astype(np.float32)


@pytest.mark.parametrize("n", [128, 300])
@pytest.mark.parametrize("debug", [False, True])
def test_softmax_ragged(n, debug, rng):
    x = rng.standard_normal((n, 256)).astype(np.float32)
    kernel = nki.jit(softmax_rows.fn, debug=debug)
    np.testing.assert_allclose(kernel(x), softmax_ref(x), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("kernel", [rmsnorm_rows, rmsnorm_nki0])
def test_rmsnorm_ragged(kernel, rng):
    x = rng.standard_normal((200, 384)).astype(np.float32)
    w = rng.standard_normal(384).astype(np.float32)
    np.testing.assert_allclose(kernel(x, w, 1e-6), rmsnorm_ref(x, w, 1e-6), rtol=1e-5, atol=1e-6)


def test_rmsnorm_bf16(rng):
    x = rng.standard_normal((130, 128)).astype(nl.bfloat16)
    w = rng.standard_normal(128).astype(nl.bfloat16)
    out = rmsnorm_nki0(x, w, 1e-6)
    assert out.dtype == nl.bfloat16
    np.testing.assert_allclose(out.astype(np.float32), rmsnorm_ref(x, w, 1e-6), rtol=1e-2, atol=1e-2)


def test_debug_mode_exposes_uninitialised_reads(rng):
    def forgot_to_load(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)   # never written
        nl.store(out, value=t + 1.0)
        return out

    x = np.zeros((4, 4), np.float32)
    assert np.isnan(nki.jit(forgot_to_load, debug=True)(x)).all()
    np.testing.assert_array_equal(nki.jit(forgot_to_load, debug=False)(x), np.ones((4, 4)))
