"""Integer subscripts follow NKI's rank rule: an on-chip tensor keeps its partition axis (at size
1) and stays at least 2-D, an HBM tensor drops integer-indexed axes but stays at least 1-D; the
views read and write the elements NumPy indexing names."""
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki.errors import NKIOutOfBoundsError

SHAPES = {}


@nki.jit
def subscript_shapes(x):
    out = nl.ndarray((1,), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((64, 8, 4), dtype=nl.float32, buffer=nl.sbuf)
    h = nl.ndarray((4, 64, 8), dtype=nl.float32, buffer=nl.hbm)
    SHAPES.update({
        "sbuf[0, :, :]": t[0, :, :].shape, "sbuf[:, :, 0]": t[:, :, 0].shape, "sbuf[:, 0]": t[:, 0].shape,
        "sbuf[:, 0, 1]": t[:, 0, 1].shape, "sbuf[0, 0, 1]": t[0, 0, 1].shape,
        "sbuf[:, 0, 1][:, :1]": t[:, 0, 1][:, :1].shape, "sbuf[:, -1, -1]": t[:, -1, -1].shape,
        "hbm[0, :, :]": h[0, :, :].shape, "hbm[0, 1]": h[0, 1].shape, "hbm[0, 1, 2]": h[0, 1, 2].shape,
    })
    nisa.dma_copy(dst=out, src=x)
    return out


def test_the_documented_shapes():
    subscript_shapes(np.zeros((1,), np.float32))
    assert SHAPES == {
        "sbuf[0, :, :]": (1, 8, 4), "sbuf[:, :, 0]": (64, 8), "sbuf[:, 0]": (64, 4),
        "sbuf[:, 0, 1]": (64, 1), "sbuf[0, 0, 1]": (1, 1),
        "sbuf[:, 0, 1][:, :1]": (64, 1), "sbuf[:, -1, -1]": (64, 1),
        "hbm[0, :, :]": (64, 8), "hbm[0, 1]": (8,), "hbm[0, 1, 2]": (1,),
    }


@nki.jit
def column_bounds(x, bounds, col: int):
    """``x`` where ``lo <= j < hi`` (column j), the bounds one column of a (P, n) tile, selected with
    an integer subscript and then sliced again as the library's attention kernels do."""
    P, F = x.shape
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    xt = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    b = nl.ndarray(bounds.shape, dtype=bounds.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=x)
    nisa.dma_copy(dst=b, src=bounds)
    lo, hi = b[:, 2 * col], b[:, 2 * col + 1]
    r = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.range_select(dst=r, on_true_tile=xt, comp_op0=nl.greater_equal, comp_op1=nl.less,
                      bound0=lo[:P, :1], bound1=hi[:P, :1], on_false_value=-1.0)
    # an integer-indexed row of a 2-D tile is a (1, F) view: one partition written
    nisa.tensor_scalar(dst=r[0, :], data=xt[0, :], op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_integer_column_views_feed_instructions(rng):
    P, F = 32, 16
    x = rng.standard_normal((P, F)).astype(np.float32)
    lo = rng.integers(0, F // 2, (P, 2)).astype(np.float32)
    bounds = np.stack([lo, lo + rng.integers(1, F // 2, (P, 2))], axis=2).reshape(P, 4)
    for col in (0, 1):
        got = column_bounds(x, bounds, col)
        j = np.arange(F)
        keep = (j >= bounds[:, 2 * col, None]) & (j < bounds[:, 2 * col + 1, None])
        want = np.where(keep, x, np.float32(-1.0))
        want[0] = x[0] * 2
        np.testing.assert_array_equal(got, want)


@nki.jit
def out_of_range_column(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out[:, :1], src=t[:, x.shape[1]])
    return out


def test_an_integer_past_the_axis_is_refused():
    with pytest.raises(NKIOutOfBoundsError, match="out of bounds"):
        out_of_range_column(np.zeros((4, 3), np.float32))
