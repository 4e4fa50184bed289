"""``nisa.nonzero_with_count``: per GpSimd core (partitions 0, 16, ..., 112) the indices of the
nonzero elements, the padding and the count, against NumPy; other partitions are left as they were."""
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki.errors import NKITypeError


@nki.jit(target="trn2")
def nonzero(x, offset: int, padding: float):
    P, T = x.shape
    out = nl.ndarray((P, T + 1), dtype=nl.float32, buffer=nl.shared_hbm)
    s = nl.ndarray((P, T), dtype=x.dtype, buffer=nl.sbuf)
    d = nl.ndarray((P, T + 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=x)
    nisa.memset(dst=d, value=7.0)
    nisa.nonzero_with_count(dst=d, src=s, index_offset=offset, padding_val=padding)
    nisa.dma_copy(dst=out, src=d)
    return out


def reference(x, offset, padding):
    P, T = x.shape
    want = np.full((P, T + 1), 7.0, np.float32)
    for p in range(0, P, 16):
        idx = np.flatnonzero(x[p])
        want[p] = padding
        want[p, :idx.size] = idx + offset
        want[p, T] = idx.size
    return want


@pytest.mark.parametrize("offset,padding", [(0, -1.0), (100, 0.0)])
def test_matches_the_reference(rng, offset, padding):
    x = (rng.random((128, 24)) < 0.3).astype(np.float32) * rng.standard_normal((128, 24)).astype(np.float32)
    x[16] = 0.0  # a row with nothing
    np.testing.assert_array_equal(nonzero(x, offset, padding), reference(x, offset, padding))


def test_neuroncore_v2_has_no_such_instruction():
    k = nki.jit(nonzero.fn, target="trn1")
    with pytest.raises(NKITypeError, match="NeuronCore-v3 or newer"):
        k(np.zeros((16, 4), np.float32), 0, -1.0)
