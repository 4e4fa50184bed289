"""``nl.ndarray(..., address=(partition_offset, byte_offset))``: tiles the kernel places count the
bytes they cover in each partition once, however many tiles share them (rotating buffers); a
placement past the partitions or the buffer's bytes is refused."""
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki.errors import NKILimitError, NKITypeError

ROW = 64 * 1024  # bytes per partition of one (128, 16384) float32 tile


@nki.jit
def rotating_buffers(x, slots: int, tiles: int):
    """Sum of ``tiles`` multiples of x, each loaded into one of ``slots`` placed buffers in turn;
    every buffer is a tile of its own, all made first (as the library's modular allocator does), so
    that each is live from the start to its use."""
    P, F = x.shape
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    acc = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf, address=(0, slots * ROW))
    nisa.memset(dst=acc, value=0.0)
    bufs = [nl.ndarray((P, ROW // 4), dtype=nl.float32, buffer=nl.sbuf, address=(0, (i % slots) * ROW))
            for i in range(tiles)]
    for i, buf in enumerate(bufs):
        nisa.dma_copy(dst=buf[:, :F], src=x)
        nisa.tensor_scalar(dst=buf[:, :F], data=buf[:, :F], op0=nl.multiply, operand0=float(i + 1))
        nisa.tensor_tensor(dst=acc, data1=acc, data2=buf[:, :F], op=nl.add)
    nisa.dma_copy(dst=out, src=acc)
    return out


def test_tiles_at_the_same_bytes_count_once(rng):
    x = rng.standard_normal((128, 32)).astype(np.float32)
    # six 64 KiB tiles alive at once would need 384 KiB per partition; at two slots they need 128
    got = rotating_buffers(x, 2, 6)
    np.testing.assert_allclose(got, x * sum(range(1, 7)), rtol=1e-6)


@nki.jit
def placed_at(x, address):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf, address=address)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_placements_outside_the_memory_are_refused(rng):
    x = rng.standard_normal((64, 16)).astype(np.float32)
    np.testing.assert_array_equal(placed_at(x, (64, 1024)), x)
    with pytest.raises(NKILimitError, match="partitions 96..159"):
        placed_at(x, (96, 0))
    with pytest.raises(NKILimitError, match="SBUF capacity"):
        placed_at(x, (0, 224 * 1024 - 32))  # Trainium2: 224 KiB per partition
    with pytest.raises(NKITypeError, match="partition_offset, byte_offset"):
        placed_at(x, 4096)


@nki.jit
def two_tiles_at_one_address(x, offset: int):
    """a loaded, b loaded at `offset` bytes from a, then a read: on the device b overwrote a
    when the two ranges overlap."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf, address=(0, 0))
    b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf, address=(0, offset))
    nisa.dma_copy(dst=a, src=x)
    nisa.tensor_scalar(dst=b, data=a, op0=nl.multiply, operand0=2.0)
    nisa.tensor_tensor(dst=b, data1=a, data2=b, op=nl.add)
    nisa.dma_copy(dst=out, src=b)
    return out


def test_placed_tiles_in_use_together_at_shared_bytes_are_warned_about(rng):
    from torchneuron.nki.liveness import PlacedTilesOverlapWarning
    x = rng.standard_normal((128, 16)).astype(np.float32)
    with pytest.warns(PlacedTilesOverlapWarning, match="overlapping bytes are in use together"):
        two_tiles_at_one_address(x, 32)   # b's bytes begin inside a's 64
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlacedTilesOverlapWarning)
        two_tiles_at_one_address(x, 64)   # side by side
        rotating_buffers(x, 2, 6)         # each slot's tiles used one after another
