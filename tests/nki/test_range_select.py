"""``nisa.range_select``: a causal/windowed mask by free index against per-partition bounds, with the
fused max reduction, against NumPy."""
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

FILL = -3.0e38


@nki.jit
def windowed(x, lo, hi, start: float):
    P, F = x.shape
    out = nl.ndarray((P, F + 1), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    b0 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    b1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    m = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=b0, src=lo)
    nisa.dma_copy(dst=b1, src=hi)
    r = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.range_select(r, on_true_tile=t, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=b0, bound1=b1,
                      range_start=start, on_false_value=FILL, reduce_op=nl.maximum, reduce_res=m,
                      reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.dma_copy(dst=out[:, 0:F], src=r)
    nisa.dma_copy(dst=out[:, F:F + 1], src=m)
    return out


@pytest.mark.parametrize("start", [0.0, 32.0])
def test_matches_the_reference(rng, start):
    P, F = 16, 48
    x = rng.standard_normal((P, F)).astype(np.float32)
    lo = rng.integers(0, 40, (P, 1)).astype(np.float32)
    hi = lo + rng.integers(1, 30, (P, 1)).astype(np.float32)
    idx = np.arange(F, dtype=np.float32)[None, :] + start
    want = np.where((idx >= lo) & (idx < hi), x, np.float32(FILL)).astype(np.float32)
    got = windowed(x, lo, hi, start)
    np.testing.assert_array_equal(got[:, :F], want)
    np.testing.assert_array_equal(got[:, F], want.max(axis=1))
