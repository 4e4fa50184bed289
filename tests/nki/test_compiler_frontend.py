"""``nki.compiler.frontend``: a trace of a kernel for given inputs is a run on the emulator, so a
configuration the kernel refuses raises and an accepted one returns its outputs."""
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki.errors import NKILimitError
from torchneuron.nki.frontend import ParserFrontend


@nki.jit
def copy_rows(x):
    assert x.shape[1] % 4 == 0, "columns must be a multiple of 4"
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_a_trace_runs_the_kernel_with_its_checks():
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    result = ParserFrontend().compile(copy_rows, inputs={"x": x}, target="trn3", lnc=1)
    np.testing.assert_array_equal(result.outputs, x)
    with pytest.raises(AssertionError, match="multiple of 4"):
        ParserFrontend().compile(copy_rows, inputs={"x": np.zeros((8, 6), np.float32)}, target="trn2")
    with pytest.raises(NKILimitError):
        ParserFrontend().compile(copy_rows, inputs={"x": np.zeros((256, 8), np.float32)}, target="trn2")
