"""``nisa.nc_match_replace8`` (the documented pairing of repeated values) and ``nisa.nc_n_gather``
(gathers within each partition), against NumPy."""
import numpy as np

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


@nki.jit
def match_replace(data, vals):
    P, F = data.shape
    out = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    out_idx = nl.ndarray((P, 8), dtype=nl.uint32, buffer=nl.shared_hbm)
    d = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    v = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
    i = nl.ndarray((P, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.dma_copy(dst=d, src=data)
    nisa.dma_copy(dst=v, src=vals)
    nisa.nc_match_replace8(dst=d, dst_idx=i, data=d, vals=v, imm=float("-inf"))
    nisa.dma_copy(dst=out, src=d)
    nisa.dma_copy(dst=out_idx, src=i)
    return out, out_idx


def test_repeated_values_pair_with_positions_from_the_highest_slot():
    data = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8]], np.float32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 8]], np.float32)
    out, idx = match_replace(data, vals)
    np.testing.assert_array_equal(idx, [[2, 10, 9, 8, 7, 6, 5, 4]])
    np.testing.assert_array_equal(out, [[1, 2, -np.inf, 4] + [-np.inf] * 7])


def test_top8_of_random_rows(rng):
    data = rng.standard_normal((16, 64)).astype(np.float32)
    top = -np.sort(-data, axis=1)[:, :8]
    out, idx = match_replace(data, top)
    np.testing.assert_array_equal(np.take_along_axis(data, idx.astype(np.int64), axis=1), top)
    want = data.copy()
    np.put_along_axis(want, idx.astype(np.int64), -np.inf, axis=1)
    np.testing.assert_array_equal(out, want)


@nki.jit
def gather(data, indices):
    P = data.shape[0]
    out = nl.ndarray(indices.shape, dtype=data.dtype, buffer=nl.shared_hbm)
    d = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.sbuf)
    i = nl.ndarray(indices.shape, dtype=nl.uint32, buffer=nl.sbuf)
    g = nl.ndarray(indices.shape, dtype=data.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=d, src=data)
    nisa.dma_copy(dst=i, src=indices)
    nisa.nc_n_gather(dst=g, data=d, indices=i)
    nisa.dma_copy(dst=out, src=g)
    return out


def test_gather_within_partitions_over_flattened_free_axes(rng):
    data = rng.standard_normal((8, 4, 6)).astype(nl.bfloat16)
    indices = rng.integers(0, 24, (8, 10)).astype(np.uint32)
    want = np.take_along_axis(data.reshape(8, 24), indices.astype(np.int64), axis=1)
    np.testing.assert_array_equal(gather(data, indices).view(np.uint16), want.view(np.uint16))
