"""Tensor indirection: ``.ap(scalar_offset=|vector_offset=, indirect_dim=)`` gathers and scatters at
offsets read from SBUF tiles, against NumPy indexing; ``.ap()`` on a strided view starts at the view."""
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki.errors import NKIOutOfBoundsError, NKITypeError


@nki.jit
def rows_from(table, start, rows: int):
    """``table[b, start:start + rows, :]`` for every batch b, the start read from a tile."""
    B, S, D = table.shape
    out = nl.ndarray((B, rows, D), dtype=table.dtype, buffer=nl.shared_hbm)
    s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=start)
    for b in range(B):
        t = nl.ndarray((rows, D), dtype=table.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=table.ap(pattern=[[D, rows], [1, D]], offset=b * S * D,
                                          scalar_offset=s, indirect_dim=1))
        nisa.dma_copy(dst=out[b], src=t)
    return out


def test_scalar_offset_moves_the_start_along_the_indirect_axis(rng):
    table = rng.standard_normal((2, 16, 8)).astype(np.float32)
    for start in (0, 5, 10):
        got = rows_from(table, np.array([[start]], np.int32), 6)
        np.testing.assert_array_equal(got, table[:, start:start + 6])
    # the addresses depend on data: the signature is interpreted on every call
    info = rows_from.cache_info()
    assert info["replays"] == 0 and any("indirection" in r for r in info["unreplayable"])


@nki.jit
def gather_scatter(table, idx, dest_idx, dest_rows: int):
    """out[dest_idx[i]] = table[idx[i]] for i over the index tiles' partitions."""
    n = idx.shape[0]
    R, D = table.shape
    out = nl.ndarray((dest_rows, D), dtype=table.dtype, buffer=nl.shared_hbm)
    zero = nl.ndarray((dest_rows, D), dtype=table.dtype, buffer=nl.sbuf)
    nisa.memset(dst=zero, value=0.0)
    nisa.dma_copy(dst=out, src=zero)
    i_sb = nl.ndarray((n, 1), dtype=nl.uint32, buffer=nl.sbuf)
    j_sb = nl.ndarray((n, 1), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.dma_copy(dst=i_sb, src=idx)
    nisa.dma_copy(dst=j_sb, src=dest_idx)
    t = nl.ndarray((n, D), dtype=table.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=table.ap(pattern=[[D, n], [1, D]], vector_offset=i_sb, indirect_dim=0))
    nisa.dma_copy(dst=out.ap(pattern=[[D, n], [1, D]], vector_offset=j_sb, indirect_dim=0), src=t)
    return out


def test_vector_offset_gathers_and_scatters_rows(rng):
    table = rng.standard_normal((40, 12)).astype(nl.bfloat16)
    idx = rng.integers(0, 40, size=(32, 1)).astype(np.uint32)
    dest = rng.permutation(50)[:32].astype(np.uint32).reshape(32, 1)
    got = gather_scatter(table, idx, dest, 50)
    want = np.zeros((50, 12), nl.bfloat16)
    want[dest[:, 0]] = table[idx[:, 0]]
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_indices_outside_the_tensor_are_an_error(rng):
    table = np.zeros((8, 4), np.float32)
    idx = np.arange(16, dtype=np.uint32).reshape(16, 1)
    with pytest.raises(NKIOutOfBoundsError, match="out of bounds of hbm tensor"):
        gather_scatter(table, idx, np.arange(16, dtype=np.uint32).reshape(16, 1), 16)
    with pytest.raises(NKITypeError, match="indirect_dim 3 is not an axis"):
        @nki.jit
        def bad_dim(t, s):
            s_sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
            nisa.dma_copy(dst=s_sb, src=s)
            return t.ap(pattern=[[4, 2], [1, 4]], scalar_offset=s_sb, indirect_dim=3)
        bad_dim(table, np.zeros((1, 1), np.int32))


@nki.jit
def window_of_a_row(x, j: int):
    out = nl.ndarray((4, 3), dtype=x.dtype, buffer=nl.shared_hbm)
    # the view x[j] starts at row j; the pattern walks it in steps of 2
    nisa.dma_copy(dst=out, src=x[j].ap(pattern=[[3 * 2, 4], [2, 3]], offset=1))
    return out


def test_an_access_pattern_on_a_view_starts_at_the_view(rng):
    x = rng.standard_normal((3, 24)).astype(np.float32)
    got = window_of_a_row(x, 2)
    flat = x[2]
    want = np.array([[flat[1 + 6 * i + 2 * k] for k in range(3)] for i in range(4)], np.float32)
    np.testing.assert_array_equal(got, want)


@nki.jit
def scatter_into_blocks(cache, rows, slots):
    """A paged cache (blocks, block_len, D) seen as (blocks * block_len, D) slots; row i of ``rows``
    is written to slot ``slots[i]``: the indirect axis is the reshaped tensor's."""
    nb, bl, D = cache.shape
    n = rows.shape[0]
    flat = cache.reshape((nb * bl, D))
    s_sb = nl.ndarray((n, 1), dtype=nl.int32, buffer=nl.sbuf)
    r_sb = nl.ndarray((n, D), dtype=rows.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=s_sb, src=slots)
    nisa.dma_copy(dst=r_sb, src=rows)
    nisa.dma_copy(dst=flat.ap(pattern=[[D, n], [1, D]], offset=0, vector_offset=s_sb, indirect_dim=0), src=r_sb)
    return cache


def test_the_indirect_axis_is_that_of_the_tensor_ap_is_called_on(rng):
    cache = rng.standard_normal((8, 4, 16)).astype(np.float32)
    rows = rng.standard_normal((6, 16)).astype(np.float32)
    slots = rng.permutation(32)[:6].astype(np.int32).reshape(6, 1)
    want = cache.copy().reshape(32, 16)
    want[slots[:, 0]] = rows
    got = scatter_into_blocks(cache.copy(), rows, slots)
    np.testing.assert_array_equal(np.asarray(got).reshape(32, 16), want)


@nki.jit
def gather_scatter_skipping(table, idx, dest_idx, dest_rows: int):
    """gather_scatter with oob_mode.skip on both transfers: rows whose index is outside are not moved."""
    n = idx.shape[0]
    R, D = table.shape
    out = nl.ndarray((dest_rows, D), dtype=table.dtype, buffer=nl.shared_hbm)
    fill = nl.ndarray((dest_rows, D), dtype=table.dtype, buffer=nl.sbuf)
    nisa.memset(dst=fill, value=-1.0)
    nisa.dma_copy(dst=out, src=fill)
    i_sb = nl.ndarray((n, 1), dtype=nl.int32, buffer=nl.sbuf)
    j_sb = nl.ndarray((n, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=i_sb, src=idx)
    nisa.dma_copy(dst=j_sb, src=dest_idx)
    t = nl.ndarray((n, D), dtype=table.dtype, buffer=nl.sbuf)
    nisa.memset(dst=t, value=7.0)
    nisa.dma_copy(dst=t, src=table.ap(pattern=[[D, n], [1, D]], vector_offset=i_sb, indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip)
    nisa.dma_copy(dst=out.ap(pattern=[[D, n], [1, D]], vector_offset=j_sb, indirect_dim=0), src=t,
                  oob_mode=nisa.oob_mode.skip)
    return out


def test_oob_mode_skip_leaves_out_the_rows_outside(rng):
    table = rng.standard_normal((10, 4)).astype(np.float32)
    idx = np.array([[0], [12], [3], [-1], [9], [5]], np.int32)      # 12 and -1: outside the table
    dest = np.array([[1], [0], [20], [2], [4], [3]], np.int32)      # 20: outside the output
    got = gather_scatter_skipping(table, idx, dest, 6)
    want = np.full((6, 4), -1.0, np.float32)
    gathered = np.full((6, 4), 7.0, np.float32)
    for i, j in enumerate(idx[:, 0]):
        if 0 <= j < 10:
            gathered[i] = table[j]
    for i, j in enumerate(dest[:, 0]):
        if 0 <= j < 6:
            want[j] = gathered[i]
    np.testing.assert_array_equal(got, want)
    with pytest.raises(NKIOutOfBoundsError, match="out of bounds"):
        gather_scatter(table, idx.astype(np.uint32) % 16, dest.astype(np.uint32) % 6, 6)
