"""``nisa.local_gather``: each GpSimd core's 16 partitions gather runs of their own free elements at the
offsets the core's index block holds (read down its columns), against a NumPy loop over the cores."""
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki.errors import NKIOutOfBoundsError, NKITypeError


@nki.jit
def gather(src, index, run: int, valid: int):
    P = src.shape[0]
    out = nl.ndarray((P, valid * run), dtype=src.dtype, buffer=nl.shared_hbm)
    s = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
    i = nl.ndarray(index.shape, dtype=nl.uint16, buffer=nl.sbuf)
    d = nl.ndarray((P, valid * run), dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=src)
    nisa.dma_copy(dst=i, src=index)
    nisa.local_gather(dst=d, src_buffer=s, index=i, num_elem_per_idx=run, num_valid_indices=valid)
    nisa.dma_copy(dst=out, src=d)
    return out


def reference(src, index, run, valid):
    P = src.shape[0]
    flat = src.reshape(P, -1)
    out = np.empty((P, valid * run), src.dtype)
    for core in range(P // 16):
        rows = slice(16 * core, 16 * core + 16)
        offsets = index[rows].flatten(order="F")[:valid]
        for k, o in enumerate(offsets):
            out[rows, k * run:(k + 1) * run] = flat[rows, o:o + run]
    return out


@pytest.mark.parametrize("P, shape, n, run, valid", [(128, (64, 4), 4, 4, 64), (32, (40,), 2, 1, 20),
                                                    (48, (8, 8), 1, 8, 16)])
def test_each_core_gathers_from_its_partitions(rng, P, shape, n, run, valid):
    src = rng.standard_normal((P, *shape)).astype(nl.bfloat16)
    free = int(np.prod(shape))
    index = rng.integers(0, free // run, (P, n)).astype(np.uint16) * run
    got = gather(src, index, run, valid)
    np.testing.assert_array_equal(got.view(np.uint16), reference(src, index, run, valid).view(np.uint16))


def test_bad_arguments_are_refused(rng):
    src = rng.standard_normal((32, 16)).astype(np.float32)
    index = np.zeros((32, 2), np.uint16)
    with pytest.raises(NKITypeError, match="num_elem_per_idx"):
        gather(src, index, 3, 4)
    with pytest.raises(NKITypeError, match="num_valid_indices"):
        gather(src, index, 1, 33)
    with pytest.raises(NKIOutOfBoundsError, match="past the 16 elements"):
        gather(src, np.full((32, 2), 15, np.uint16), 2, 4)
    with pytest.raises(NKITypeError, match="uint16"):
        @nki.jit
        def int32_index(s_h, i_h):
            s = nl.ndarray(s_h.shape, dtype=s_h.dtype, buffer=nl.sbuf)
            i = nl.ndarray(i_h.shape, dtype=nl.int32, buffer=nl.sbuf)
            nisa.dma_copy(dst=s, src=s_h)
            nisa.dma_copy(dst=i, src=i_h)
            return nisa.local_gather(s, i)
        int32_index(src, index)
