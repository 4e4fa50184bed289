"""Every enforced hardware limit: break it, check the error names the limit,
the value and the kernel line."""
import os

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

from neuron_testing import line_of

HERE = os.path.abspath(__file__)


def expect_limit(exc_info, marker, *needles):
    msg = str(exc_info.value)
    assert f"{HERE}:{line_of(HERE, marker)}" in msg, msg
    for n in needles:
        assert n in msg, msg


def test_partition_over_128_on_allocation():
    @nki.jit
    def k(x):
        t = nl.ndarray((256, 64), dtype=nl.float32, buffer=nl.sbuf)  # MARK-PARTITION-ALLOC
        return x

    with pytest.raises(nki.NKILimitError) as e:
        k(np.zeros((1, 1), np.float32))
    expect_limit(e, "MARK-PARTITION-ALLOC", "nl.tile_size.pmax", "256", "128")
    assert isinstance(e.value, ValueError)


def test_partition_over_128_on_load():
    @nki.jit
    def k(x):
        t = nl.load(x[0:200, :])  # MARK-PARTITION-LOAD
        return x

    with pytest.raises(nki.NKILimitError) as e:
        k(np.zeros((256, 8), np.float32))
    expect_limit(e, "MARK-PARTITION-LOAD", "nl.tile_size.pmax", "200")


def test_psum_free_size():
    @nki.jit
    def k(x):
        acc = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum)  # MARK-PSUM-FREE
        return x

    with pytest.raises(nki.NKILimitError) as e:
        k(np.zeros((1, 1), np.float32))
    expect_limit(e, "MARK-PSUM-FREE", "nl.tile_size.psum_fmax", "1024", "512")


def test_matmul_stationary_free_size():
    @nki.jit
    def k(a, b):
        r = nisa.nc_matmul(nl.load(a), nl.load(b))  # MARK-STATIONARY
        return a

    with pytest.raises(nki.NKILimitError) as e:
        k(np.zeros((128, 256), np.float32), np.zeros((128, 64), np.float32))
    expect_limit(e, "MARK-STATIONARY", "gemm_stationary_fmax", "256", "128")


def test_matmul_moving_free_size():
    @nki.jit
    def k(a, b):
        acc = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        acc += nl.matmul(nl.load(a), nl.load(b), transpose_x=True)  # MARK-MOVING
        return a

    with pytest.raises(nki.NKILimitError) as e:
        k(np.zeros((128, 128), np.float32), np.zeros((128, 1024), np.float32))
    expect_limit(e, "MARK-MOVING", "gemm_moving_fmax", "1024", "512")


def test_sbuf_capacity():
    @nki.jit
    def k(x):
        keep = []
        for i in range(10):
            # 32 KiB per partition each; the eighth exceeds 224 KiB on v3
            keep.append(nl.ndarray((128, 8192), dtype=nl.float32, buffer=nl.sbuf))  # MARK-SBUF
        for t in keep:  # all used after the last allocation: all live together
            nisa.memset(t, 0.0)
        return x

    with pytest.raises(nki.NKILimitError) as e:
        k(np.zeros((1, 1), np.float32))
    expect_limit(e, "MARK-SBUF", "SBUF capacity", "229376")


def test_sbuf_freed_when_tiles_die():
    @nki.jit
    def k(x):
        for i in range(100):
            t = nl.ndarray((128, 8192), dtype=nl.float32, buffer=nl.sbuf)  # rebinding frees the previous one
        return x

    k(np.zeros((1, 1), np.float32))


def test_sbuf_capacity_depends_on_target():
    def body(x):
        t = nl.ndarray((128, 52 * 1024), dtype=nl.float32, buffer=nl.sbuf)  # 208 KiB per partition
        return x

    nki.jit(body, target="v3")(np.zeros((1, 1), np.float32))
    with pytest.raises(nki.NKILimitError, match="196608"):
        nki.jit(body, target="v2")(np.zeros((1, 1), np.float32))


def test_psum_capacity():
    @nki.jit
    def k(x):
        banks = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(9)]  # MARK-PSUM-CAP
        for b in banks:
            nisa.memset(b, 0.0)
        return x

    with pytest.raises(nki.NKILimitError) as e:
        k(np.zeros((1, 1), np.float32))
    expect_limit(e, "MARK-PSUM-CAP", "PSUM capacity", "16384")


def test_store_out_of_bounds_of_hbm_tensor():
    @nki.jit
    def k(x):
        out = nl.ndarray((200, 64), dtype=x.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(2):
            t = nl.load(x[i * 128:(i + 1) * 128, :])
            nl.store(out[i * 128:(i + 1) * 128, :], value=t)  # MARK-STORE-OOB
        return out

    with pytest.raises(nki.NKIOutOfBoundsError) as e:
        k(np.zeros((256, 64), np.float32))
    expect_limit(e, "MARK-STORE-OOB", "out of bounds", "(200, 64)")
    assert isinstance(e.value, IndexError)


def test_dma_copy_out_of_bounds():
    @nki.jit
    def k(x):
        t = nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[64:192, :])  # MARK-LOAD-OOB
        return x

    with pytest.raises(nki.NKIOutOfBoundsError) as e:
        k(np.zeros((128, 64), np.float32))
    expect_limit(e, "MARK-LOAD-OOB", "out of bounds")


def test_masked_off_overrun_is_allowed():
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        i = nl.arange(128)[:, None]
        j = nl.arange(8)[None, :]
        nl.store(out[i, j], value=nl.load(x[i, j], mask=(i < 100)), mask=(i < 100))
        return out

    x = np.arange(800, dtype=np.float32).reshape(100, 8)
    np.testing.assert_array_equal(k(x), x)


def test_bn_stats_free_size():
    @nki.jit
    def k(x):
        s = nisa.bn_stats(nl.load(x))  # MARK-BN
        return x

    with pytest.raises(nki.NKILimitError) as e:
        k(np.zeros((128, 1024), np.float32))
    expect_limit(e, "MARK-BN", "bn_stats_fmax", "1024", "512")


def test_engines_cannot_read_hbm():
    @nki.jit
    def k(x):
        y = nl.exp(x)  # MARK-HBM
        return x

    with pytest.raises(nki.NKITypeError) as e:
        k(np.zeros((4, 4), np.float32))
    expect_limit(e, "MARK-HBM", "load it first")
