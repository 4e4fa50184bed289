"""``nisa.dma_compute``: sums of sources in the DMA engines (float32, rounded once), including the
read-modify-write scatter through an indirect destination; its cost in the performance model."""
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki.errors import NKITypeError


@nki.jit
def residual_sum(x, a, b):
    P, F = x.shape
    out = nl.ndarray((P, F), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_compute(dst=t, srcs=[x, a, b], reduce_op=nl.add)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_sources_are_summed_in_float32_and_rounded_once(rng):
    x, a, b = (rng.standard_normal((32, 48)).astype(nl.bfloat16) for _ in range(3))
    want = (x.astype(np.float32) + a.astype(np.float32) + b.astype(np.float32)).astype(nl.bfloat16)
    np.testing.assert_array_equal(residual_sum(x, a, b).view(np.uint16), want.view(np.uint16))


@nki.jit
def scatter_add(table, rows, idx):
    n, D = rows.shape
    i_sb = nl.ndarray((n, 1), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.dma_copy(dst=i_sb, src=idx)
    r = nl.ndarray((n, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=r, src=rows)
    dst = table.ap(pattern=[[D, n], [1, D]], vector_offset=i_sb, indirect_dim=0)
    nisa.dma_compute(dst=dst, srcs=[dst, r], reduce_op=nl.add, unique_indices=True)
    return table


def test_scatter_read_modify_write_adds_into_the_indexed_rows(rng):
    table = rng.standard_normal((20, 8)).astype(np.float32)
    rows = rng.standard_normal((6, 8)).astype(np.float32)
    idx = np.array([3, 0, 19, 7, 8, 11], np.uint32).reshape(6, 1)
    want = table.copy()
    want[idx[:, 0]] += rows
    np.testing.assert_array_equal(scatter_add(table, rows, idx), want)


@nki.jit
def scaled(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_compute(t, [x, x], nl.add, scales=[1.0, 2.0])
    return x


def test_unsupported_scales_are_refused_and_the_model_charges_dma():
    x = np.zeros((4, 4), np.float32)
    with pytest.raises(NKITypeError, match="scales must be 1.0"):
        scaled(x)
    big = np.zeros((128, 512), np.float32)
    rep = nki.estimate(residual_sum, big, big, big)
    rows = [r for r in rep.timeline() if r["name"] == "nisa.dma_compute"]
    assert len(rows) == 1 and rows[0]["engine"] == "dma"
