"""``nki.collectives`` on the emulator's one rank: single-rank groups are exact copies, groups of
several ranks are refused with an error naming why."""
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import collectives as ncc
from torchneuron.nki.errors import NKITypeError


@nki.jit
def reduce_over(x, groups):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    r = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    ncc.all_reduce(srcs=[t], dsts=[r], replica_group=ncc.ReplicaGroup(groups), op=nl.add)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_one_rank_reduces_to_itself_and_several_ranks_are_refused(rng):
    x = rng.standard_normal((16, 8)).astype(np.float32)
    np.testing.assert_array_equal(reduce_over(x, ((0,),)), x)
    assert ncc.rank_id() == 0
    with pytest.raises(NKITypeError, match="several ranks"):
        reduce_over(x, ((0, 1),))
    with pytest.raises(NKITypeError, match="overlap"):
        ncc.ReplicaGroup([[0, 1], [1, 2]])
