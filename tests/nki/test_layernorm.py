"""Layer norm with bn_stats / bn_aggr (NKI 0.x style), rows tiled and ragged."""
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


@nki.jit
def layer_norm(x, gamma, beta, eps):
    n, d = x.shape
    fmax = nl.tile_size.bn_stats_fmax
    chunks = (d + fmax - 1) // fmax
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    g = nl.ndarray((128, d), dtype=gamma.dtype, buffer=nl.sbuf)
    b = nl.ndarray((128, d), dtype=beta.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=g, src=gamma.ap([[0, 128], [1, d]]))
    nisa.dma_copy(dst=b, src=beta.ap([[0, 128], [1, d]]))
    for t in range((n + 127) // 128):
        r0, rows = t * 128, min(128, n - t * 128)
        xt = nl.ndarray((128, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt[0:rows], src=x[r0:r0 + rows])
        stats = nl.ndarray((128, 6 * chunks), dtype=nl.float32, buffer=nl.sbuf)
        for c in range(chunks):
            c0 = c * fmax
            width = min(fmax, d - c0)
            nisa.bn_stats(dst=stats[0:rows, 6 * c:6 * c + 6], data=xt[0:rows, c0:c0 + width])
        mv = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mv[0:rows], data=stats[0:rows])
        rstd = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=rstd[0:rows], data=mv[0:rows, 1:2], op0=np.add, operand0=eps)
        nisa.activation(dst=rstd[0:rows], op=nl.rsqrt, data=rstd[0:rows])
        y = nl.ndarray((128, d), dtype=nl.float32, buffer=nl.sbuf)
        # (x - mean) * rstd in one instruction, then * gamma + beta
        nisa.tensor_scalar(dst=y[0:rows], data=xt[0:rows], op0=np.subtract, operand0=mv[0:rows, 0:1],
                           op1=np.multiply, operand1=rstd[0:rows])
        nisa.tensor_tensor(dst=y[0:rows], data1=y[0:rows], data2=g[0:rows], op=np.multiply)
        yo = nl.ndarray((128, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=yo[0:rows], data1=y[0:rows], data2=b[0:rows], op=np.add)
        nisa.dma_copy(dst=out[r0:r0 + rows], src=yo[0:rows])
    return out


def layer_norm_ref(x, gamma, beta, eps):
    x = x.astype(np.float64)
    mu = x.mean(axis=1, keepdims=True)
    var = x.var(axis=1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


@pytest.mark.parametrize("shape", [(256, 1024), (200, 700)])
def test_layer_norm(shape, rng):
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    gamma = rng.standard_normal(shape[1]).astype(np.float32)
    beta = rng.standard_normal(shape[1]).astype(np.float32)
    out = layer_norm(x, gamma, beta, 1e-5)
    np.testing.assert_allclose(out, layer_norm_ref(x, gamma, beta, 1e-5), rtol=1e-4, atol=1e-4)


def test_bn_stats_layout():
    @nki.jit
    def k(x):
        out = nl.ndarray((x.shape[0], 6), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, value=nisa.bn_stats(nl.load(x)))
        return out

    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    s = k(x)
    even, odd = x[:, 0::2], x[:, 1::2]
    np.testing.assert_allclose(s[:, 0], 3)
    np.testing.assert_allclose(s[:, 1], even.mean(axis=1))
    np.testing.assert_allclose(s[:, 2], even.var(axis=1) * 3, rtol=1e-6)
    np.testing.assert_allclose(s[:, 3], 2)
    np.testing.assert_allclose(s[:, 4], odd.mean(axis=1))
    np.testing.assert_allclose(s[:, 5], odd.var(axis=1) * 2, rtol=1e-6)
