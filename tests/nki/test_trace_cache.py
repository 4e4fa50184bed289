"""Trace cache: a signature's instructions are recorded once, then replayed.

Replays must be bit-identical to interpreting the kernel again, for both
language generations, SPMD grids, masks and index grids; a new signature
records again; what cannot be replayed is detected and interpreted.
"""
import numpy as np
import pytest
from test_aliases_and_api import isa_tour
from test_attention import causal_attention_fwd
from test_elementwise import add_beta1, add_nki0
from test_indexing import avg_pool, transpose_rows
from test_layernorm import layer_norm
from test_matmul import matmul_beta1, matmul_nki0
from test_softmax_rmsnorm import rmsnorm_nki0, rmsnorm_rows, softmax_rows

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


def fresh(kernel, **options):
    """The same kernel function under a new jit (its own, empty trace cache)."""
    return nki.jit(kernel.fn, **{"target": kernel.target, "debug": kernel.debug, **options})


def normal(*shape, dtype=np.float32):
    return lambda rng: rng.standard_normal(shape).astype(dtype)


CASES = {
    "matmul_beta1_bf16": (matmul_beta1, (), [normal(256, 256, dtype=nl.bfloat16), normal(256, 1024, dtype=nl.bfloat16)]),
    "matmul_nki0_bf16": (matmul_nki0, (), [normal(256, 256, dtype=nl.bfloat16), normal(256, 1024, dtype=nl.bfloat16)]),
    "attention_bf16": (causal_attention_fwd, (), [normal(2, 256, 64, dtype=nl.bfloat16)] * 3),
    "add_beta1_grid": (add_beta1, (2, 2), [normal(256, 1024, dtype=np.float16)] * 2),
    "add_nki0_grid": (add_nki0, (2, 2), [normal(256, 1024, dtype=nl.bfloat16)] * 2),
    "softmax_masked": (softmax_rows, (), [normal(300, 256)]),
    "rmsnorm_masked": (rmsnorm_rows, (), [normal(200, 384), normal(384), lambda rng: 1e-6]),
    "rmsnorm_nki0": (rmsnorm_nki0, (), [normal(200, 384, dtype=nl.bfloat16), normal(384, dtype=nl.bfloat16),
                                        lambda rng: 1e-6]),
    "layer_norm": (layer_norm, (), [normal(200, 700), normal(700), normal(700), lambda rng: 1e-5]),
    "transpose_index_grids": (transpose_rows, (), [lambda rng: rng.integers(0, 1000, (7, 15)).astype(np.int32),
                                                   lambda rng: 3, lambda rng: 5]),
    "avg_pool_mgrid": (avg_pool, (), [normal(16, 12, 20), lambda rng: 4]),
    "isa_tour": (isa_tour, (), [lambda rng: rng.uniform(0.5, 1.5, (8, 16)).astype(np.float32)] * 2),
}


def same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


# Cases whose programs are lowered into pre-bound closures (nki/lower/); the
# others replay instruction by instruction.  Both replays are checked.
LOWERED = {"matmul_beta1_bf16", "matmul_nki0_bf16", "attention_bf16", "add_nki0_grid", "add_beta1_grid",
           "avg_pool_mgrid", "transpose_index_grids", "layer_norm", "rmsnorm_nki0"}


@pytest.mark.parametrize("fast", [True, False], ids=["lowered", "generic"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_replay_is_bitwise_equal_to_interpretation(case, fast, rng, monkeypatch):
    monkeypatch.setenv("TORCHNEURON_NKI_FAST_REPLAY", "1" if fast else "0")
    kernel, grid, makers = CASES[case]
    cached = fresh(kernel)[grid] if grid else fresh(kernel)
    interpreted = fresh(kernel, trace_cache=False)[grid] if grid else fresh(kernel, trace_cache=False)
    calls = [[m(rng) for m in makers] for _ in range(3)]   # different data every call
    for i, args in enumerate(calls):
        out = cached(*[a.copy() if isinstance(a, np.ndarray) else a for a in args])
        same_bits(out, interpreted(*args))
    info = cached.cache_info()
    assert (info["signatures"], info["traces"], info["replays"], info["interpreted"]) == (1, 1, 2, 0), info
    assert info["lowered"] == (1 if fast and case in LOWERED else 0), info
    assert interpreted.cache_info()["interpreted"] == 3


def test_benchmark_kernels_are_lowered_and_bitwise_equal(rng):
    """The kernels of benchmarks/nki_kernels.py (bf16 tiled matmul, fused causal attention)."""
    import ml_dtypes
    from benchmarks.nki_kernels import attention_kernel, matmul_kernel
    bf16 = ml_dtypes.bfloat16
    cases = [(matmul_kernel, lambda: [rng.standard_normal((256, 256)).astype(bf16),
                                      rng.standard_normal((256, 1024)).astype(bf16)]),
             (attention_kernel, lambda: [rng.standard_normal((2, 256, 64)).astype(bf16) for _ in range(3)])]
    for kernel, make in cases:
        cached, interpreted = fresh(kernel), fresh(kernel, trace_cache=False)
        for _ in range(3):
            args = make()
            same_bits(cached(*args), interpreted(*args))
        assert cached.cache_info()["lowered"] == 1, cached.cache_info()


def test_replay_does_not_run_the_kernels_python(rng):
    runs = []

    @nki.jit
    def scale(x, factor):
        runs.append(factor)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(x) * factor)
        return out

    x = rng.standard_normal((128, 64)).astype(np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(scale(x, 2.0), x * 2)
    assert runs == [2.0]
    # a new signature records again: other scalar, other shape, other dtype, other grid
    np.testing.assert_array_equal(scale(x, 3.0), x * 3)
    np.testing.assert_array_equal(scale(x[:64], 2.0), x[:64] * 2)
    scale(x.astype(np.float16), 2.0)
    scale[2](x, 2.0)
    assert runs == [2.0, 3.0, 2.0, 2.0, 2.0, 2.0]
    assert scale.cache_info()["signatures"] == 5
    scale(x[:64], 2.0)
    assert len(runs) == 6
    # 0.0 and -0.0 are different constants
    assert np.signbit(scale(np.ones((128, 64), np.float32), -0.0)).all()
    assert not np.signbit(scale(np.ones((128, 64), np.float32), 0.0)).any()


def test_grid_instances_replay_their_own_program_ids(rng):
    @nki.jit
    def tag(x):
        out = nl.ndarray((4, 128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        nl.store(out[i], value=nl.load(x[i]) + float(i * 100 + nl.num_programs(0)))
        return out

    for _ in range(2):
        x = rng.standard_normal((4, 128, 8)).astype(np.float32)
        np.testing.assert_array_equal(tag[4](x), x + (np.arange(4) * 100 + 4)[:, None, None].astype(np.float32))
    assert tag.cache_info()["replays"] == 1


def test_debug_mode_still_exposes_uninitialised_reads_on_replay():
    @nki.jit(debug=True)
    def forgot_to_load(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)   # never written
        nl.store(out, value=t + x.shape[1])
        return out

    for _ in range(3):
        assert np.isnan(forgot_to_load(np.zeros((4, 4), np.float32))).all()
    assert forgot_to_load.cache_info()["replays"] == 2


def test_reading_tile_values_in_python_falls_back_to_interpretation(rng):
    @nki.jit
    def branchy(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        if t.read()[0, 0] > 0:          # control flow on data: cannot be replayed
            t = t * 2
        nl.store(out, value=t)
        return out

    pos = np.ones((8, 8), np.float32)
    np.testing.assert_array_equal(branchy(pos), pos * 2)
    np.testing.assert_array_equal(branchy(-pos), -pos)
    np.testing.assert_array_equal(branchy(pos), pos * 2)
    info = branchy.cache_info()
    assert info["signatures"] == 0 and info["traces"] == 1 and info["interpreted"] == 2
    assert len(info["unreplayable"]) == 1 and "reading tile values" in info["unreplayable"][0]
    assert "test_trace_cache.py" in info["unreplayable"][0]


def test_tile_from_another_launch_falls_back(rng):
    kept = []

    @nki.jit
    def keep(x):
        kept.append(nl.load(x))
        return x

    @nki.jit
    def add_kept(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(x) + kept[-1])      # a tile made by another launch
        return out

    x = np.ones((8, 8), np.float32)
    keep(x)
    for _ in range(2):
        np.testing.assert_array_equal(add_kept(x), 2 * x)
    info = add_kept.cache_info()
    assert info["signatures"] == 0 and info["interpreted"] == 1
    assert "no instruction of this launch created" in info["unreplayable"][0]


def test_switched_off_by_option_and_environment(rng, monkeypatch):
    def copy(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(x))
        return out

    x = rng.standard_normal((128, 32)).astype(np.float32)
    off = nki.jit(copy, trace_cache=False)
    off(x)
    off(x)
    assert off.cache_info()["traces"] == 0 and off.cache_info()["interpreted"] == 2
    on = nki.jit(copy)
    monkeypatch.setenv("TORCHNEURON_NKI_TRACE_CACHE", "0")
    on(x)
    on(x)
    assert on.cache_info()["traces"] == 0 and on.cache_info()["interpreted"] == 2
    monkeypatch.setenv("TORCHNEURON_NKI_TRACE_CACHE", "1")
    for _ in range(2):
        np.testing.assert_array_equal(on(x), x)
    assert on.cache_info()["traces"] == 1 and on.cache_info()["replays"] == 1


def test_limit_errors_name_the_kernel_line_on_every_call():
    @nki.jit
    def too_tall(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(x))  # LIMIT-LINE
        return out

    x = np.zeros((256, 4), np.float32)
    for _ in range(2):
        with pytest.raises(nki.NKILimitError) as err:
            too_tall(x)
        assert "test_trace_cache.py" in err.value.location and "too_tall" in err.value.location
    assert too_tall.cache_info()["signatures"] == 0


def test_inputs_written_in_place_and_strided_inputs_on_replay(rng):
    @nki.jit
    def bump(x):
        nl.store(x, value=nl.load(x) + 1.0)
        return x

    for _ in range(2):
        base = rng.standard_normal((8, 32)).astype(np.float32)
        strided = base[:, ::2]
        expect = strided + 1
        bump(strided)
        np.testing.assert_array_equal(base[:, ::2], expect)
    assert bump.cache_info()["replays"] == 1


def test_random_numbers_replay_like_interpretation(rng):
    @nki.jit
    def drop(x, seed):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.random_seed(nl.load(seed))
        nl.store(out, value=nl.dropout(nl.load(x), 0.5))
        return out

    x = np.ones((16, 64), np.float32)
    ref = nki.jit(drop.fn, trace_cache=False)
    for s in (1, 2, 1):
        seed = np.full((1, 1), s, np.int32)
        np.testing.assert_array_equal(drop(x, seed), ref(x, seed))
    assert drop.cache_info()["replays"] == 2


def test_device_print_runs_on_replay(capsys):
    @nki.jit
    def show(x):
        t = nl.load(x)
        nl.device_print("tile", t)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        return out

    show(np.zeros((1, 2), np.float32))
    show(np.full((1, 2), 7, np.float32))
    printed = capsys.readouterr().out
    assert "tile [[0. 0.]]" in printed and "tile [[7. 7.]]" in printed
    assert show.cache_info()["replays"] == 1


def test_lowered_replays_from_several_threads(rng):
    """Lowered programs reuse preallocated buffers: concurrent launches must each get their own."""
    import concurrent.futures
    import ml_dtypes
    from benchmarks.nki_kernels import attention_kernel
    kernel, ref = fresh(attention_kernel), fresh(attention_kernel, trace_cache=False)
    calls = [[rng.standard_normal((1, 256, 64)).astype(ml_dtypes.bfloat16) for _ in range(3)] for _ in range(8)]
    kernel(*calls[0])
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda a: kernel(*a), calls))
    for args, out in zip(calls, outs):
        same_bits(out, ref(*args))
    assert kernel.cache_info()["lowered"] == 1


def test_lowered_loads_keep_their_values_when_the_source_changes(rng):
    """A loaded tile that engines read once is converted straight from HBM (no tile copy);
    if its region is overwritten while the tile is live, the tile must be copied at the load."""
    @nki.jit
    def overwrite(x, y):
        out = nl.ndarray((3,) + x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)                          # read once, after x changes
        u = nl.load(x)                          # read twice
        w = nl.load(y)                          # stored as is (a raw read)
        nl.store(x, value=nl.load(y))           # overwrite the region t was loaded from
        nl.store(out[0], value=nl.multiply(t, 2.0, dtype=nl.float32))
        nl.store(out[1], value=nl.add(u, u, dtype=nl.float32))
        nl.store(out[2], value=w)
        return out

    ref = nki.jit(overwrite.fn, trace_cache=False)
    for _ in range(3):
        x = rng.standard_normal((128, 64)).astype(nl.bfloat16)
        y = rng.standard_normal((128, 64)).astype(nl.bfloat16)
        x2 = x.copy()
        same_bits(overwrite(x, y), ref(x2, y))
        same_bits(x, x2)
    assert overwrite.cache_info()["lowered"] == 1, overwrite.cache_info()


def test_lowered_replay_with_arguments_sharing_memory(rng):
    """Two HBM arguments viewing the same memory: a write through one changes what the
    other holds, and a tile loaded before that write keeps the old values."""
    @nki.jit
    def through(x, y):
        t = nl.load(x)
        nl.store(y, value=nl.load(y) + 1.0)
        nl.store(y, value=nl.add(t, t, dtype=y.dtype))
        return y

    ref = nki.jit(through.fn, trace_cache=False)
    for _ in range(3):
        a = rng.standard_normal((128, 32)).astype(nl.bfloat16)
        b = a.copy()
        through(a, a)
        ref(b, b)
        same_bits(a, b)
    assert through.cache_info()["lowered"] == 1, through.cache_info()


@pytest.mark.parametrize("bf16_gemm", [True, False], ids=["matrix unit", "float32 GEMM"])
def test_matmul_operands_follow_a_write_through_another_argument(rng, monkeypatch, bf16_gemm):
    """Matmul operands loaded from an argument no step writes are prepared once per launch
    (staged for the matrix unit, or converted to float32) and shared by every load of the
    region; when another argument is written, it may be the same memory, so each load reads
    it again."""
    from test_matmul import NO_MATRIX_UNIT

    from torchneuron.nki import ops
    if bf16_gemm and not ops.BF16_TILE_GEMM:
        pytest.skip(NO_MATRIX_UNIT)
    monkeypatch.setattr(ops, "BF16_TILE_GEMM", bf16_gemm)

    @nki.jit
    def square_twice(a, b):
        result = nl.ndarray((2, 128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in range(2):
            acc = nl.zeros((128, 128), nl.float32, buffer=nl.psum)
            acc += nisa.nc_matmul(nl.load(a[0:128, 0:128]), nl.load(a[0:128, 0:128]))
            nl.store(result[i], value=nl.copy(acc))
            if i == 0:  # b := 2a, where b may be a
                nl.store(b, value=nl.multiply(nl.load(a), 2.0, dtype=b.dtype))
        return result

    ref = nki.jit(square_twice.fn, trace_cache=False)
    x = rng.standard_normal((128, 128)).astype(nl.bfloat16)
    for shared in (False, True, True):
        a, a2 = x.copy(), x.copy()
        got = square_twice(a, a if shared else a.copy())
        want = ref(a2, a2 if shared else a2.copy())
        same_bits(got, want)
        assert shared != np.array_equal(want[0], want[1])
    assert square_twice.cache_info()["lowered"] == 1, square_twice.cache_info()


def test_a_lowered_launch_keeps_no_argument_alive(rng):
    """What a launch leaves for the next (staged matmul operands) holds none of its arguments."""
    import gc
    import weakref
    from test_matmul import matmul_isa_accumulate

    kernel = fresh(matmul_isa_accumulate)
    refs = []
    for _ in range(3):
        lhsT, rhs = (rng.standard_normal(s).astype(nl.bfloat16) for s in ((256, 256), (256, 512)))
        kernel(lhsT, rhs)
        refs += [weakref.ref(lhsT), weakref.ref(rhs)]
        del lhsT, rhs
    gc.collect()
    assert kernel.cache_info()["lowered"] == 1
    assert all(r() is None for r in refs)


@nki.jit
def accumulate_and_peek(lhsT, rhs):
    """``psum += nc_matmul`` runs broken by reads of the PSUM tile (the running sum
    copied out after every second product) and by a product of computed tiles."""
    k_dim, m_dim = lhsT.shape
    n_dim = rhs.shape[1]
    steps = nl.ndarray((k_dim // 256, m_dim, n_dim), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((m_dim, n_dim), nl.float32, buffer=nl.psum)
    for k in nl.sequential_range(k_dim // 128):
        a = nl.load(lhsT[k * 128:(k + 1) * 128, :])
        b = nl.load(rhs[k * 128:(k + 1) * 128, :])
        if k == 3:
            a = nl.multiply(a, 2.0, dtype=lhsT.dtype)  # a computed tile: not the same for the whole launch
        acc += nisa.nc_matmul(a, b)
        if k % 2 == 1:
            nl.store(steps[k // 2], value=nl.copy(acc))
    return steps


def test_psum_accumulation_runs_keep_their_order_around_reads(rng):
    """The lowering runs a run of accumulating matmuls as one pass (lower.matmul.chain_gemms),
    but never across a read of the PSUM tile or a product it cannot delay."""
    kernel, interpreted = fresh(accumulate_and_peek), fresh(accumulate_and_peek, trace_cache=False)
    for _ in range(3):
        args = [rng.standard_normal(s).astype(nl.bfloat16) for s in ((1024, 128), (1024, 512))]
        same_bits(kernel(*args), interpreted(*args))
    assert kernel.cache_info()["lowered"] == 1, kernel.cache_info()


@nki.jit
def store_half(x):
    """Writes the first half of its result only (the rest keeps its initial zeros)."""
    out = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out[:64, :], value=nl.load(x[:64, :]))
    return out


def test_launch_results_are_fresh_and_freed_without_a_garbage_collection(rng):
    """A result written whole is allocated uninitialised and reused once the caller
    lets go of it (no reference cycle keeps it until a collection); one written in
    part keeps zeros where it is not written."""
    import gc
    from benchmarks.nki_kernels import matmul_kernel
    kernel = fresh(matmul_kernel)
    args = [rng.standard_normal(s).astype(nl.bfloat16) for s in ((256, 256), (256, 512))]
    gc.disable()
    try:
        first = kernel(*args)
        kept, second = first.copy(), kernel(*[a * 2 for a in args])
        assert not np.shares_memory(first, second)
        assert first.tobytes() == kept.tobytes()  # a live result is never reused
        address = second.ctypes.data
        del second
        third = kernel(*args)
        assert third.ctypes.data == address and third.tobytes() == kept.tobytes()
        half = fresh(store_half)
        x = rng.standard_normal((128, 512)).astype(np.float32)
        for _ in range(3):
            r = half(x)
            assert np.array_equal(r[:64], x[:64]) and not r[64:].any()
            r[64:] = 1.0  # garbage left for the next launch's storage
            del r
    finally:
        gc.enable()
