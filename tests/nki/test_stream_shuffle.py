"""``nisa.nc_stream_shuffle``: partitions moved within each quadrant of 32, against a NumPy reference."""
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki.errors import NKIError, NKITypeError


def reference(dst, src, mask):
    out = dst.copy()
    for i in range(dst.shape[0]):
        m = mask[i % 32]
        if m != 255:
            out[i] = src[(i // 32) * 32 + m]
    return out


@nki.jit
def shuffle(src, dst_init, mask, in_place: bool):
    out = nl.ndarray(dst_init.shape, dtype=dst_init.dtype, buffer=nl.shared_hbm)
    s = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=src)
    if in_place:
        nisa.nc_stream_shuffle(s, s, list(mask))
        nisa.dma_copy(dst=out, src=s)
    else:
        d = nl.ndarray(dst_init.shape, dtype=dst_init.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=d, src=dst_init)
        nisa.nc_stream_shuffle(dst=d, src=s, shuffle_mask=list(mask))
        nisa.dma_copy(dst=out, src=d)
    return out


@pytest.mark.parametrize("partitions", [32, 96, 128])
@pytest.mark.parametrize("in_place", [False, True])
def test_matches_the_reference(rng, partitions, in_place):
    src = rng.standard_normal((partitions, 3, 5)).astype(nl.bfloat16)
    dst = src if in_place else rng.standard_normal((partitions, 3, 5)).astype(nl.bfloat16)
    mask = tuple(int(m) for m in rng.permutation(32))
    mask = mask[:5] + (255, 255) + mask[7:]
    got = shuffle(src, dst, mask, in_place)
    np.testing.assert_array_equal(got.view(np.uint16), reference(dst, src, mask).view(np.uint16))


def test_broadcast_of_one_partition_replays_bit_for_bit(rng):
    src = rng.standard_normal((64, 16)).astype(np.float32)
    mask = (0,) * 32
    first = shuffle(src, src, mask, False)
    np.testing.assert_array_equal(first, reference(src, src, mask))
    again = shuffle(src * 2, src, mask, False)  # replayed from the trace
    np.testing.assert_array_equal(again, reference(src, src * 2, mask))
    assert shuffle.cache_info()["replays"] >= 1


@nki.jit
def bad_shuffle(src, mask, dtype):
    s = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
    d = nl.ndarray(src.shape, dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=src)
    nisa.nc_stream_shuffle(dst=d, src=s, shuffle_mask=list(mask))
    return src


def test_bad_masks_and_dtypes_are_refused():
    src = np.zeros((32, 4), np.float32)
    with pytest.raises(NKITypeError, match="shuffle_mask must list 32"):
        bad_shuffle(src, tuple(range(31)), nl.float32)
    with pytest.raises(NKITypeError, match="shuffle_mask must list 32"):
        bad_shuffle(src, (40,) + tuple(range(31)), nl.float32)
    with pytest.raises(NKITypeError, match="same dtype"):
        bad_shuffle(src, tuple(range(32)), nl.bfloat16)
    with pytest.raises(NKIError, match="outside src"):
        bad_shuffle(np.zeros((16, 4), np.float32), (20,) + tuple(range(31)), nl.float32)


def test_the_performance_model_charges_the_vector_engine():
    src = np.zeros((128, 512), np.float32)
    rep = nki.estimate(shuffle, src, src, tuple(range(32)), False)
    rows = [r for r in rep.timeline() if r["name"] == "nisa.nc_stream_shuffle"]
    assert len(rows) == 1 and rows[0]["engine"] == "vector"
    assert rows[0]["end"] - rows[0]["start"] >= 512 / perf_clock("vector") * 0.99


def perf_clock(engine):
    return nki.get_machine().clock_ghz[engine]
