"""Fused causal self-attention forward: QK^T, causal mask, softmax and PV in one kernel."""
import time

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


@nki.jit
def causal_attention_fwd(q, k, v):
    """q, k, v: (heads, seq, d_head) with seq <= 512 and d_head <= 128.

    Per head and block of 128 queries: scores = Q K^T / sqrt(d) on the Tensor
    Engine (Q^T stationary, K^T moving), causal mask with affine_select, a
    row softmax whose exp also sums the row, then P V accumulated in PSUM over
    128-key chunks (P^T chunks made with nc_transpose).
    """
    heads, seq, d = q.shape
    out = nl.ndarray((heads, seq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    scale = 1.0 / float(np.sqrt(d))
    for h in nl.affine_range(heads):
        k_t = nl.load_transpose2d(k[h])                  # (d, seq): keys along the free axis
        v_chunks = [nl.load(v[h, c * 128:(c + 1) * 128, :]) for c in range(seq // 128)]
        for qb in nl.affine_range(seq // 128):
            q_t = nl.load_transpose2d(q[h, qb * 128:(qb + 1) * 128, :])   # (d, 128)
            s_psum = nisa.nc_matmul(stationary=q_t, moving=k_t)          # (128, seq) fp32 PSUM
            i_q = nl.arange(128)[:, None]
            i_k = nl.arange(seq)[None, :]
            # keep key j for query row qb*128 + i when j <= qb*128 + i
            s = nisa.affine_select(pred=(qb * 128 + i_q - i_k >= 0), on_true_tile=s_psum,
                                   on_false_value=-3.0e38, dtype=nl.float32)
            neg_max = nisa.tensor_reduce(op=np.max, data=s, axis=1, negate=True, keepdims=True)
            row_sum = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
            p = nisa.activation(op=nl.exp, data=s, bias=neg_max * scale, scale=scale,
                                reduce_op=np.add, reduce_res=row_sum, dtype=nl.bfloat16)
            acc = nl.zeros((128, d), dtype=nl.float32, buffer=nl.psum)
            for c in nl.affine_range(qb + 1):            # later key chunks are fully masked
                p_t = nisa.tensor_copy(nisa.nc_transpose(p[:, c * 128:(c + 1) * 128]), dtype=nl.bfloat16)
                acc += nisa.nc_matmul(stationary=p_t, moving=v_chunks[c])
            o = nisa.tensor_scalar(data=acc, op0=np.divide, operand0=row_sum, dtype=q.dtype)
            nl.store(out[h, qb * 128:(qb + 1) * 128, :], value=o)
    return out


def attention_ref(q, k, v):
    q, k, v = (t.astype(np.float32) for t in (q, k, v))
    d = q.shape[-1]
    s = q @ k.transpose(0, 2, 1) / np.sqrt(d)
    seq = q.shape[1]
    s = np.where(np.tril(np.ones((seq, seq), bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return p @ v


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-2), (nl.bfloat16, 3e-2)])
def test_causal_attention_4_heads_512_tokens(dtype, tol, rng):
    q, k, v = (rng.standard_normal((4, 512, 64)).astype(dtype) for _ in range(3))
    start = time.perf_counter()
    out = causal_attention_fwd(q, k, v)
    elapsed = time.perf_counter() - start
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_allclose(out.astype(np.float32), attention_ref(q, k, v), rtol=tol, atol=tol)
    assert elapsed < 10, f"attention took {elapsed:.1f}s"
