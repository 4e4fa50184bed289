"""Virtual registers: loaded from tiles, moved, stored, and used as dynamic loop bounds and
``while`` conditions, against a NumPy reference of the same loop."""
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki.errors import NKITypeError


@nki.jit
def doubling_until_zero(x, count):
    """Adds x to an accumulator `count` times (a register loaded from data drives a while loop and
    counts down); also stores the number of iterations through a second register."""
    P, F = x.shape
    out = nl.ndarray((P, F + 1), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    nisa.dma_copy(dst=t, src=x)
    c = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=c, src=count)
    reg = nisa.register_alloc()
    nisa.register_load(reg, c)
    iterations = nisa.register_alloc(0)
    while reg:
        nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
        nisa.tensor_scalar(dst=c, data=c, op0=nl.subtract, operand0=1)
        nisa.register_load(reg, c)
        nisa.register_move(iterations, int(iterations) + 1)
    for _ in nl.dynamic_range(0, iterations):  # as many more times, bounded by the register
        nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
    n = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=n, value=0.0)
    n_reg = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.register_store(n_reg, iterations)
    nisa.dma_copy(dst=out[:, 0:F], src=acc)
    nisa.dma_copy(dst=out[0:1, F:F + 1], src=n_reg)
    return out


@pytest.mark.parametrize("count", [0, 3])
def test_registers_drive_loops_from_data(rng, count):
    x = rng.standard_normal((8, 16)).astype(np.float32)
    got = doubling_until_zero(x, np.array([[count]], np.int32))
    want = np.zeros_like(x)
    for _ in range(2 * count):
        want = want + x
    np.testing.assert_allclose(got[:, :16], want, rtol=1e-6)
    assert got[0, 16] == count
    assert any("register" in r for r in doubling_until_zero.cache_info()["unreplayable"])


def test_registers_hold_32_bit_integers():
    r = nisa.register_alloc(2 ** 31)
    assert int(r) == -2 ** 31 and bool(nisa.register_alloc(0)) is False
    with pytest.raises(NKITypeError, match="holds an integer"):
        nisa.register_move(r, 1.5)
