"""Index grids, mgrid, slices with steps, nl.ds and access patterns."""
import numpy as np

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


@nki.jit
def transpose_rows(x, rows, cols):
    """Every partition row holds a rows x cols matrix (flattened); transpose each in SBUF."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    p = x.shape[0]
    tile = nl.load(x)
    ip = nl.arange(p)[:, None, None]
    ir = nl.arange(rows)[None, :, None]
    ic = nl.arange(cols)[None, None, :]
    t_out = nl.ndarray((p, rows * cols), dtype=x.dtype, buffer=nl.sbuf)
    # read row-major (r, c), write row-major (c, r)
    t_out[ip, ic * rows + ir] = nl.copy(tile[ip, ir * cols + ic])
    nl.store(out, value=t_out)
    return out


def test_transpose_with_index_grids():
    p, r, c = 7, 3, 5
    x = np.arange(p * r * c, dtype=np.int32).reshape(p, r * c)
    out = transpose_rows(x, r, c)
    ref = x.reshape(p, r, c).transpose(0, 2, 1).reshape(p, r * c)
    np.testing.assert_array_equal(out, ref)


@nki.jit
def avg_pool(x, k):
    """2-D average pooling of a C x H x W tensor (C on partitions) with an mgrid."""
    c, h, w = x.shape
    out = nl.ndarray((c, h // k, w // k), dtype=x.dtype, buffer=nl.shared_hbm)
    i_c, i_h, i_kh, i_w, i_kw = nl.mgrid[0:c, 0:h // k, 0:k, 0:w // k, 0:k]
    tile = nl.load(x)
    window = tile[i_c, i_h * k + i_kh, i_w * k + i_kw]        # 5-D view
    pooled = nl.sum(window, axis=[2, 4]) / float(k * k)
    nl.store(out, value=pooled)
    return out


def test_avg_pool_mgrid(rng):
    x = rng.standard_normal((16, 12, 20)).astype(np.float32)
    out = avg_pool(x, 4)
    ref = x.reshape(16, 3, 4, 5, 4).mean(axis=(2, 4))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_mgrid_attributes_and_ds(rng):
    @nki.jit
    def k(x):
        out = nl.ndarray((64, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        g = nl.mgrid[0:64, 0:8]
        t = nl.load(x[g.p, g.x * 2])                     # every other column
        nl.store(out[nl.ds(0, 64), nl.ds(0, 8)], value=t)
        return out

    x = rng.standard_normal((64, 16)).astype(np.float32)
    np.testing.assert_array_equal(k(x), x[:, ::2])


def test_stepped_slices_and_access_pattern(rng):
    @nki.jit
    def k(x):
        out = nl.ndarray((32, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        out2 = nl.ndarray((32, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((32, 16), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        even = nl.ndarray((32, 8), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=even, src=t[:, 0:16:2])       # slice with a step
        nisa.dma_copy(dst=out, src=even)
        # the same access written as a hardware access pattern: [[partition step, n], [step, n]]
        odd = nl.ndarray((32, 8), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=odd, src=t.ap([[16, 32], [2, 8]], offset=1))
        nisa.dma_copy(dst=out2, src=odd)
        return out, out2

    x = rng.standard_normal((32, 16)).astype(np.float32)
    even, odd = k(x)
    np.testing.assert_array_equal(even, x[:, 0::2])
    np.testing.assert_array_equal(odd, x[:, 1::2])


def test_partition_broadcast_access_pattern(rng):
    @nki.jit
    def k(w):
        out = nl.ndarray((128, w.shape[0]), dtype=w.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((128, w.shape[0]), dtype=w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=w.ap([[0, 128], [1, w.shape[0]]]))   # step 0: same row everywhere
        nisa.dma_copy(dst=out, src=t)
        return out

    w = rng.standard_normal(48).astype(np.float32)
    np.testing.assert_array_equal(k(w), np.broadcast_to(w, (128, 48)))


def test_block_dimensions_and_par_dim(rng):
    @nki.jit
    def k(x):
        n = x.shape[0] // 128
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        buf = nl.ndarray((n, nl.par_dim(128), x.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
        for i in nl.affine_range(n):
            buf[i] = nl.load(x[i * 128:(i + 1) * 128, :])
        for i in nl.sequential_range(n):
            nl.store(out[i * 128:(i + 1) * 128, :], value=buf[i] * 2)
        return out

    x = rng.standard_normal((384, 32)).astype(np.float32)
    np.testing.assert_array_equal(k(x), 2 * x)


def test_load_transpose_and_tile_methods(rng):
    @nki.jit
    def k(x):
        out = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load_transpose2d(x)
        row = nl.load(x[0:1, :])                          # (1, n)
        b = row.broadcast_to((x.shape[0], x.shape[1]))    # same row on every partition
        s = nl.transpose(b)
        nl.store(out, value=t - s)
        return out

    x = rng.standard_normal((64, 96)).astype(np.float32)
    np.testing.assert_allclose(k(x), x.T - np.broadcast_to(x[0:1, :], x.shape).T)
