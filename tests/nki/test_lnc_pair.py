"""The two cores of a logical NeuronCore (``kernel[2]``): ``nisa.sendrecv`` exchanges tiles and
``nisa.core_barrier`` orders their writes to shared HBM, against NumPy references."""
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki.errors import NKITypeError
from torchneuron.nki.lnc import LncDeadlock


@nki.jit
def all_gather_rows(x):
    """Each core loads its half of x's rows, swaps halves with the other, stores all of x."""
    P2, F = x.shape
    P = P2 // 2
    rank = nl.program_id(0)
    out = nl.ndarray((2, P2, F), dtype=x.dtype, buffer=nl.shared_hbm)
    mine = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    theirs = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=mine, src=x[rank * P:(rank + 1) * P])
    nisa.sendrecv(src=mine, dst=theirs, send_to_rank=1 - rank, recv_from_rank=1 - rank, pipe_id=0)
    nisa.dma_copy(dst=out[rank, rank * P:(rank + 1) * P], src=mine)
    nisa.dma_copy(dst=out[rank, (1 - rank) * P:(2 - rank) * P], src=theirs)
    return out


def test_sendrecv_swaps_the_halves(rng):
    x = rng.standard_normal((64, 24)).astype(nl.bfloat16)
    got = nki.simulate(all_gather_rows[2])(x)
    np.testing.assert_array_equal(got[0].view(np.uint16), x.view(np.uint16))
    np.testing.assert_array_equal(got[1].view(np.uint16), x.view(np.uint16))
    info = all_gather_rows.cache_info()
    assert any("sendrecv" in r for r in info["unreplayable"])


@nki.jit
def reduce_through_hbm(x):
    """Core r writes x * (r + 1) into its half of a shared tensor; after the barrier each core reads
    the other's half and adds it to its own."""
    P, F = x.shape
    rank = nl.program_id(0)
    scratch = nl.ndarray((2, P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    out = nl.ndarray((2, P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=rank + 1.0)
    nisa.dma_copy(dst=scratch[rank], src=t)
    nisa.core_barrier(data=scratch, cores=(0, 1))
    other = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=other, src=scratch[1 - rank])
    nisa.tensor_tensor(dst=t, data1=t, data2=other, op=nl.add)
    nisa.dma_copy(dst=out[rank], src=t)
    return out


def test_core_barrier_makes_the_other_cores_writes_visible(rng):
    x = rng.standard_normal((32, 16)).astype(np.float32)
    got = nki.simulate(reduce_through_hbm[2])(x)
    np.testing.assert_array_equal(got[0], x * 1 + x * 2)
    np.testing.assert_array_equal(got[1], x * 2 + x * 1)


@nki.jit
def waits_for_nothing(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    if nl.program_id(0) == 0:
        nisa.sendrecv(src=t, dst=t, send_to_rank=1, recv_from_rank=1, pipe_id=0)
    return x


def test_a_receive_nobody_sends_is_a_deadlock_and_one_core_has_no_partner():
    x = np.zeros((4, 4), np.float32)
    with pytest.raises(LncDeadlock, match="core 0 waits for nisa.sendrecv from core 1, but core 1 has finished"):
        waits_for_nothing[2](x)
    with pytest.raises(NKITypeError, match="LNC degree 2"):
        waits_for_nothing(x)
