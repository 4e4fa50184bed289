"""FP8 double-row matmul (``nc_matmul(perf_mode=double_row)``): the contraction runs over the partition
axis and a first free axis of 2 of both operands, against NumPy on the FP8-rounded values."""
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki.errors import NKITypeError


@nki.jit
def double_row(a, b, dtype):
    """a [K, 2, M], b [K, 2, N] (float32 on the host, FP8 on chip) -> [M, N]."""
    K, _, M = a.shape
    N = b.shape[2]
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    tiles = []
    for x in (a, b):
        f = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=f, src=x)
        q = nl.ndarray(x.shape, dtype=dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=q, src=f)
        tiles.append(q)
    p = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=p, stationary=tiles[0], moving=tiles[1], perf_mode=nisa.matmul_perf_mode.double_row)
    r = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=r, src=p)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_a_2k_contraction_of_fp8_tiles(rng):
    a = rng.standard_normal((128, 2, 96)).astype(np.float32)
    b = rng.standard_normal((128, 2, 80)).astype(np.float32)
    qa, qb = (x.astype(nl.float8_e4m3).astype(np.float32) for x in (a, b))
    want = qa.reshape(256, 96).T @ qb.reshape(256, 80)
    np.testing.assert_allclose(double_row(a, b, nl.float8_e4m3), want, rtol=1e-5, atol=1e-4)


def test_layout_and_types_are_checked(rng):
    a = rng.standard_normal((64, 2, 8)).astype(np.float32)
    with pytest.raises(NKITypeError, match="must be one of"):
        double_row(a, a, nl.bfloat16)
    with pytest.raises(NKITypeError, match=r"must be \[K, 2, \.\.\.\]"):
        double_row(np.zeros((64, 4, 8), np.float32), np.zeros((64, 4, 8), np.float32), nl.float8_e5m2)
