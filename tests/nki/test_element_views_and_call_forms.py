"""Single-element views (``t[i, j]``) are writable destinations, and an ISA call may give its
destination positionally with its operands by keyword (``nisa.tensor_copy(t, src=x)``)."""
import numpy as np

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


@nki.jit
def element_writes(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    nisa.memset(dst=t[1, 2], value=7.0)
    nisa.tensor_scalar(dst=t[2, 3], data=t[1, 2], op0=nl.add, operand0=1.0)
    nisa.tensor_copy(t[3, 0], src=t[2, 3])
    nisa.activation(t[0, 1], op=nl.exp, data=t[0, 0])
    nisa.dma_copy(dst=out, src=t)
    return out


def reference(a):
    want = a.copy()
    want[1, 2] = 7.0
    want[2, 3] = 8.0
    want[3, 0] = 8.0
    want[0, 1] = np.exp(a[0, 0])
    return want


def test_single_elements_are_written_in_place_and_replayed(rng):
    a = rng.standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_allclose(element_writes(a), reference(a), rtol=1e-6)
    b = rng.standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_allclose(element_writes(b), reference(b), rtol=1e-6)
    assert element_writes.cache_info()["replays"] == 1
