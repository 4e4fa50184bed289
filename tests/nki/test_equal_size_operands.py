"""Two tiles of as many partitions and elements per partition combine element by element in free-axis
order, whatever their free shapes (the ISA's rule for tensor_tensor and its kin), against NumPy."""
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki.errors import NKITypeError


@nki.jit
def add_reshaped(x, bias):
    """x (P, A*B) plus bias (P, A) broadcast along a new last axis of size B, as a (P, A, B) view."""
    P, F = x.shape
    A = bias.shape[1]
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    xt = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    b = nl.ndarray((P, A), dtype=bias.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=x)
    nisa.dma_copy(dst=b, src=bias)
    wide = b.ap(pattern=[[A, P], [1, A], [0, F // A]])
    nisa.tensor_tensor(dst=xt, data1=xt, data2=wide, op=nl.add)
    nisa.dma_copy(dst=out, src=xt)
    return out


def test_a_flat_and_a_3d_operand_combine_in_order(rng):
    for _ in range(2):  # interpreted, then replayed
        x = rng.standard_normal((16, 12 * 5)).astype(np.float32)
        bias = rng.standard_normal((16, 12)).astype(np.float32)
        np.testing.assert_array_equal(add_reshaped(x, bias), x + np.repeat(bias, 5, axis=1))
    assert add_reshaped.cache_info()["replays"] == 1


@nki.jit
def add_mismatched(x, y):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    b = nl.ndarray(y.shape, dtype=y.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    nisa.dma_copy(dst=b, src=y)
    nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.add)
    nisa.dma_copy(dst=out, src=a)
    return out


def test_different_element_counts_are_refused():
    with pytest.raises(NKITypeError, match="cannot be combined"):
        add_mismatched(np.zeros((8, 6), np.float32), np.zeros((8, 4), np.float32))
    with pytest.raises(NKITypeError, match="cannot be combined"):
        add_mismatched(np.zeros((8, 6), np.float32), np.zeros((4, 12), np.float32))
