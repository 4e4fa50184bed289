"""Tiled matrix multiply with PSUM accumulation, in both language generations."""
import time

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


@nki.jit
def matmul_beta1(lhsT, rhs):
    """result = lhsT.T @ rhs; K x M and K x N inputs, tiles of 128 x 128 x 512."""
    k_dim, m_dim = lhsT.shape
    _, n_dim = rhs.shape
    tm, tk, tn = nl.tile_size.gemm_stationary_fmax, nl.tile_size.pmax, nl.tile_size.gemm_moving_fmax
    result = nl.ndarray((m_dim, n_dim), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(m_dim // tm):
        for n in nl.affine_range(n_dim // tn):
            acc = nl.zeros((tm, tn), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(k_dim // tk):
                a = nl.load(lhsT[k * tk:(k + 1) * tk, m * tm:(m + 1) * tm])
                b = nl.load(rhs[k * tk:(k + 1) * tk, n * tn:(n + 1) * tn])
                acc += nl.matmul(a, b, transpose_x=True)
            nl.store(result[m * tm:(m + 1) * tm, n * tn:(n + 1) * tn], value=nl.copy(acc, dtype=result.dtype))
    return result


@nki.jit
def matmul_nki0(lhsT, rhs):
    """Same computation with destination-first ISA calls; the K loop keeps the rhs
    block in SBUF and accumulates in PSUM without an explicit zeroing."""
    k_dim, m_dim = lhsT.shape
    _, n_dim = rhs.shape
    tm, tk, tn = 128, 128, 512
    result = nl.ndarray((m_dim, n_dim), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for n in range(n_dim // tn):
        rhs_tiles = []
        for k in range(k_dim // tk):
            t = nl.ndarray((tk, tn), dtype=rhs.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=rhs[k * tk:(k + 1) * tk, n * tn:(n + 1) * tn])
            rhs_tiles.append(t)
        for m in range(m_dim // tm):
            acc = nl.ndarray((tm, tn), dtype=nl.float32, buffer=nl.psum)
            for k in range(k_dim // tk):
                a = nl.ndarray((tk, tm), dtype=lhsT.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhsT[k * tk:(k + 1) * tk, m * tm:(m + 1) * tm])
                nisa.nc_matmul(dst=acc, stationary=a, moving=rhs_tiles[k])
            out = nl.ndarray((tm, tn), dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=out, src=acc)
            nisa.dma_copy(dst=result[m * tm:(m + 1) * tm, n * tn:(n + 1) * tn], src=out)
    return result


def reference(lhsT, rhs, dtype):
    return (lhsT.astype(np.float32).T @ rhs.astype(np.float32)).astype(dtype)


@pytest.mark.parametrize("kernel", [matmul_beta1, matmul_nki0])
def test_matmul_fp32(kernel, rng):
    lhsT = rng.standard_normal((256, 256)).astype(np.float32)
    rhs = rng.standard_normal((256, 1024)).astype(np.float32)
    np.testing.assert_allclose(kernel(lhsT, rhs), lhsT.T @ rhs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel", [matmul_beta1, matmul_nki0])
def test_matmul_bf16_1024_cubed_in_seconds(kernel, rng):
    lhsT = rng.standard_normal((1024, 1024)).astype(nl.bfloat16)
    rhs = rng.standard_normal((1024, 1024)).astype(nl.bfloat16)
    start = time.perf_counter()
    out = kernel(lhsT, rhs)
    elapsed = time.perf_counter() - start
    assert out.dtype == nl.bfloat16
    ref = reference(lhsT, rhs, np.float32)
    # fp32 accumulation, one rounding to bf16 at the end
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=1e-2, atol=0.1)
    assert elapsed < 10, f"1024^3 bf16 matmul took {elapsed:.1f}s"


def test_psum_accumulate_flag(rng):
    @nki.jit
    def k(a, b):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        at = nl.load(a)
        bt = nl.load(b)
        acc = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, at, bt)                     # fresh PSUM: overwrite
        nisa.nc_matmul(acc, at, bt)                     # accumulate
        nisa.nc_matmul(acc, at, bt, accumulate=True)    # accumulate
        nisa.nc_matmul(acc, at, bt, accumulate=False)   # restart the group
        nisa.nc_matmul(acc, at, bt)
        res = nisa.tensor_copy(acc)
        nl.store(out, value=res)
        return out

    a = rng.standard_normal((32, 128)).astype(np.float32)
    b = rng.standard_normal((32, 64)).astype(np.float32)
    np.testing.assert_allclose(nki.jit(k.fn, debug=True)(a, b), 2 * a.T @ b, rtol=1e-5, atol=1e-5)


def test_fp8_and_tf32_inputs(rng):
    @nki.jit
    def k(a, b):
        out = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        ps = nisa.nc_matmul(nl.load(a), nl.load(b))
        nl.store(out, value=nisa.tensor_copy(ps))
        return out

    a = rng.standard_normal((64, 32)).astype(nl.float8_e4m3)
    b = rng.standard_normal((64, 48)).astype(nl.float8_e5m2)
    np.testing.assert_allclose(k(a, b), a.astype(np.float32).T @ b.astype(np.float32), rtol=1e-6, atol=1e-5)




def test_concurrent_launches_keep_blas_single_threaded(rng):
    """BLAS stays on one thread while launches run, whatever order concurrent
    launches end in: OpenBLAS's Haswell kernels (AVX2 hosts) give other bits on
    two threads than on one."""
    import concurrent.futures
    from threadpoolctl import threadpool_info

    def blas_threads():
        return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}

    a, b = rng.standard_normal((256, 128)).astype(np.float32), rng.standard_normal((256, 512)).astype(np.float32)
    want = matmul_beta1(a, b)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        outs = list(pool.map(lambda _: (matmul_beta1(a, b), blas_threads()), range(6)))
    assert all(np.array_equal(out, want) and threads == {1} for out, threads in outs)
    assert blas_threads() == {1}


# -- bfloat16 tiles on the host's matrix unit (torchneuron/nki/ops.py: tile_gemm) --------

from torchneuron.nki import ops  # noqa: E402

NO_MATRIX_UNIT = ("no bfloat16 matrix unit in use: the host has no AMX, ATEN_CPU_CAPABILITY is below avx512 "
                  "or TORCHNEURON_NKI_BF16_GEMM=0 (every tile takes the float32 BLAS GEMM)")
needs_matrix_unit = pytest.mark.skipif(not ops.BF16_TILE_GEMM, reason=NO_MATRIX_UNIT)


def _bf16(rng, shape):
    return rng.standard_normal(shape).astype(nl.bfloat16)


@needs_matrix_unit
@pytest.mark.parametrize("k,m,n", [(2, 1, 1), (64, 16, 100), (128, 128, 512), (128, 7, 64), (32, 128, 300)])
def test_bf16_tile_gemm_is_a_float32_accumulation(rng, k, m, n):
    # strided views, as tiles loaded straight from HBM are
    s = _bf16(rng, (k, m + 3))[:, 1:m + 1]
    mv = _bf16(rng, (k, 2 * n))[:, ::2].copy()[:, :n]
    got = ops.tile_gemm(s, mv)
    products = s.astype(np.float64)[:, :, None] * mv.astype(np.float64)[:, None, :]
    exact = products.sum(axis=0)
    # |float32 sum - exact| <= K u sum|products|, products being exact
    bound = k * np.finfo(np.float32).eps / 2 * np.abs(products).sum(axis=0)
    assert got.dtype == np.float32 and got.shape == (m, n)
    assert np.all(np.abs(got - exact) <= bound)
    blas = np.matmul(s.astype(np.float32).T, mv.astype(np.float32))
    assert np.all(np.abs(got - blas) <= 2 * bound)


@needs_matrix_unit
def test_bf16_tile_gemm_accumulates_its_rounded_sum(rng):
    s, mv = _bf16(rng, (128, 128)), _bf16(rng, (128, 512))
    psum = rng.standard_normal((128, 512)).astype(np.float32)
    want = psum + ops.tile_gemm(s, mv)
    assert ops.tile_gemm(s, mv, psum) is psum
    assert np.array_equal(psum, want)


@needs_matrix_unit
def test_bf16_tile_gemm_treats_subnormals_as_zero():
    # documented in docs/nki.md: AMX flushes subnormal inputs and sums
    tiny = np.full((2, 1), 2.0 ** -70, np.float32).astype(nl.bfloat16)
    assert ops.tile_gemm(tiny, tiny)[0, 0] == 0
    assert np.matmul(tiny.astype(np.float32).T, tiny.astype(np.float32))[0, 0] > 0


@needs_matrix_unit
@pytest.mark.parametrize("ks,m,n", [([128] * 8, 128, 512), ([128, 64, 2, 126], 17, 33), ([32], 128, 300)],
                         ids=["eight-full", "uneven", "one"])
def test_a_chain_of_tile_gemms_is_the_gemms_in_turn(rng, ks, m, n):
    # the lowered replay's `psum += nc_matmul(...)` runs (lower.matmul.chain_gemms); the
    # first shape is large enough to split between two threads
    pairs = [(ops.stage_tile(_bf16(rng, (k, m)), True), ops.stage_tile(_bf16(rng, (k, n)), False)) for k in ks]
    start = rng.standard_normal((m, n)).astype(np.float32)
    want = start.copy()
    for s, mv in pairs:
        ops.tile_gemm(s, mv, want)
    got = start.copy()
    assert ops.tile_gemm_chain(pairs, got) is got
    assert got.tobytes() == want.tobytes()
    # the binding's first product may overwrite instead of adding (as tile_gemm without out)
    from torchneuron import _C
    first = ops.tile_gemm(*pairs[0])
    for s, mv in pairs[1:]:
        ops.tile_gemm(s, mv, first)
    _C._nki_tile_gemm_chain_bf16(pairs, got, False)
    assert got.tobytes() == first.tobytes()


@needs_matrix_unit
def test_a_chain_of_tile_gemms_takes_only_staged_tiles_of_one_shape(rng):
    from torchneuron import _C
    s, mv = _bf16(rng, (4, 8)), _bf16(rng, (4, 16))
    ss, ms = ops.stage_tile(s, True), ops.stage_tile(mv, False)
    out = np.zeros((8, 16), np.float32)
    with pytest.raises(RuntimeError, match="staged tile"):
        _C._nki_tile_gemm_chain_bf16([(ss, mv)], out, True)
    with pytest.raises(RuntimeError, match="no products"):
        _C._nki_tile_gemm_chain_bf16([], out, True)
    with pytest.raises(RuntimeError, match="do not match"):
        _C._nki_tile_gemm_chain_bf16([(ss, ms), (ss, ops.stage_tile(_bf16(rng, (4, 8)), False))], out, True)
    with pytest.raises(RuntimeError, match="wrong roles"):
        _C._nki_tile_gemm_chain_bf16([(ms, ss)], out, True)
    # arrays and float32 tiles go through tile_gemm one product at a time
    mf = rng.standard_normal((4, 16)).astype(np.float32)
    want = ops.tile_gemm(ss, mf, ops.tile_gemm(s, mv, out.copy()))
    assert np.array_equal(ops.tile_gemm_chain([(s, mv), (ss, mf)], out), want)


def test_bf16_tile_gemm_binding_rejects_bad_arrays():
    from torchneuron import _C
    if not _C._nki_tile_gemm_bf16_available():
        pytest.skip(NO_MATRIX_UNIT)
    s, mv = np.zeros((4, 8), np.uint16), np.zeros((4, 16), np.uint16)
    with pytest.raises(RuntimeError, match="do not match"):
        _C._nki_tile_gemm_bf16(s, mv, np.zeros((8, 15), np.float32), False)
    with pytest.raises(RuntimeError, match="outside the matrix unit's shapes"):
        _C._nki_tile_gemm_bf16(s[:3], mv[:3], np.zeros((8, 16), np.float32), False)
    with pytest.raises(RuntimeError, match="contiguous rows"):
        _C._nki_tile_gemm_bf16(s[:, ::2], mv, np.zeros((4, 16), np.float32), False)
    with pytest.raises(TypeError):
        _C._nki_tile_gemm_bf16(s, mv, [[0.0] * 16] * 8, False)


@needs_matrix_unit
@pytest.mark.parametrize("k,m,n", [(128, 128, 512), (64, 100, 300), (2, 2, 3), (126, 17, 33)])
def test_staged_tiles_multiply_as_their_arrays(rng, k, m, n):
    s = _bf16(rng, (k, m + 3))[:, 1:m + 1]
    mv = _bf16(rng, (k, n))
    ss, ms = ops.stage_tile(s, True), ops.stage_tile(mv, False)
    assert isinstance(ss, ops.StagedTile) and ss.source is not None
    want = ops.tile_gemm(s, mv)
    for a, b in ((ss, ms), (ss, mv), (s, ms)):
        assert np.array_equal(ops.tile_gemm(a, b), want)
    # staged again in place: the new values, not the old
    s2 = _bf16(rng, (k, m))
    assert ops.stage_tile(s2, True, ss) is ss
    assert np.array_equal(ops.tile_gemm(ss, ms), ops.tile_gemm(s2, mv))
    # a float32 partner: the float32 GEMM of the staged tile's array
    mf = rng.standard_normal((k, n)).astype(np.float32)
    assert np.array_equal(ops.tile_gemm(ss, mf), ops.tile_gemm(s2, mf))


@needs_matrix_unit
def test_staged_tiles_keep_their_roles_and_limits(rng):
    from torchneuron import _C
    s, mv = _bf16(rng, (4, 8)), _bf16(rng, (4, 16))
    ss, ms = ops.stage_tile(s, True), ops.stage_tile(mv, False)
    with pytest.raises(RuntimeError, match="staged as the other operand"):
        _C._nki_tile_gemm_bf16(ms, ss, np.zeros((16, 8), np.float32), False)
    with pytest.raises(RuntimeError, match="outside the matrix unit's shapes"):
        _C._nki_stage_bf16(_bf16(rng, (4, 129)), True)
    # beyond the limits stage_tile leaves the array as it is
    wide = _bf16(rng, (4, 129))
    assert ops.stage_tile(wide, True) is not wide and not isinstance(ops.stage_tile(wide, True), ops.StagedTile)


@nki.jit
def matmul_isa_accumulate(lhsT, rhs):
    """``psum += nisa.nc_matmul(a, b)``: the lowering computes each product into PSUM."""
    k_dim, m_dim = lhsT.shape
    n_dim = rhs.shape[1]
    result = nl.ndarray((m_dim, n_dim), dtype=nl.float32, buffer=nl.shared_hbm)
    for m in nl.affine_range(m_dim // 128):
        acc = nl.zeros((128, n_dim), nl.float32, buffer=nl.psum)
        for k in nl.affine_range(k_dim // 128):
            acc += nisa.nc_matmul(nl.load(lhsT[k * 128:(k + 1) * 128, m * 128:(m + 1) * 128]),
                                  nl.load(rhs[k * 128:(k + 1) * 128, :]))
        nl.store(result[m * 128:(m + 1) * 128, :], value=nl.copy(acc))
    return result


@pytest.mark.parametrize("source", [matmul_isa_accumulate, matmul_beta1], ids=["nc_matmul", "nl.matmul"])
def test_bf16_matmul_replays_bit_for_bit_from_several_threads(rng, source):
    import concurrent.futures
    lhsT, rhs = _bf16(rng, (384, 256)), _bf16(rng, (384, 512))
    interpreted = nki.jit(source.fn, trace_cache=False)(lhsT, rhs)
    kernel = nki.jit(source.fn)
    replays = [kernel(lhsT, rhs) for _ in range(3)]
    assert kernel.cache_info()["lowered"] == 1
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        replays += list(pool.map(lambda _: kernel(lhsT, rhs), range(6)))
    assert all(np.array_equal(r, interpreted) for r in replays)
    exact = lhsT.astype(np.float64).T @ rhs.astype(np.float64)
    tol = (1e-5, 1e-4) if interpreted.dtype == np.float32 else (1e-2, 0.1)  # bf16 output: one rounding
    np.testing.assert_allclose(interpreted.astype(np.float64), exact, rtol=tol[0], atol=tol[1])
