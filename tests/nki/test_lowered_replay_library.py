"""Lowered replay of what the NKI Library's kernels use: ``nisa.memset``, a kernel's own
HBM scratch (``private_hbm``), memory reinterpreted as another dtype (``.ap(dtype=)``,
``.view(dtype)``, read and written through), ``nisa.nc_stream_shuffle``, index-dependent
values (``iota``, 0.x ``affine_select``), ``max8``, ``nc_find_index8``,
``tensor_tensor_scan``, ``activation_reduce``, ``dma_compute``, ``shared_constant``,
``tensor_scalar`` with a unary operator, ``tensor_scalar_reduce``, ``range_select``,
``reciprocal``, ``dma_transpose``, and a positional ``dst`` with keyword operands.

Each kernel is written here in the library's style; its replays must be lowered and
bit-identical to interpreting it, on new data at every call.
"""
import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

P, F = 128, 512


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def check_lowered(fn, make_args, calls=3, **options):
    """``fn`` replayed (lowered) against ``fn`` interpreted, on new arguments at every call."""
    cached, interpreted = nki.jit(fn, **options), nki.jit(fn, trace_cache=False, **options)
    for _ in range(calls):
        args = make_args()
        out = cached(*[a.copy() for a in args])
        expected = interpreted(*args)
        for o, e in zip(out if isinstance(out, tuple) else (out,), expected if isinstance(expected, tuple)
                        else (expected,)):
            same_bits(o, e)
    info = cached.cache_info()
    assert (info["replays"], info["lowered"]) == (calls - 1, 1), info
    return cached


def row_sums_with_memset(x):
    """Per-partition sums of bf16 column blocks into a float32 accumulator zeroed by memset;
    a bf16 tile filled by memset and one of its columns overwritten (a partial fill)."""
    out = nl.ndarray((P, 2), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    for i in range(F // 128):
        t = nl.ndarray((P, 128), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[:, i * 128:(i + 1) * 128])
        part = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=part, op=nl.add, data=t, axis=1)
        nisa.tensor_tensor(dst=acc, data1=acc, data2=part, op=nl.add)
    pair = nl.ndarray((P, 2), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.memset(pair, 0.1)
    nisa.memset(dst=pair[:, 1:2], value=-3)
    both = nl.ndarray((P, 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=both, data1=pair, data2=acc, op=nl.multiply)
    nisa.dma_copy(dst=out, src=both)
    return out


def counts_with_integer_memset(x):
    """An int32 tile set by memset, then incremented where x is positive."""
    out = nl.ndarray((P, 64), dtype=nl.int32, buffer=nl.shared_hbm)
    n = nl.ndarray((P, 64), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=n, value=7)
    t = nl.ndarray((P, 64), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    pos = nl.ndarray((P, 64), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=pos, data=t, op0=nl.greater, operand0=0.0)
    nisa.tensor_tensor(dst=n, data1=n, data2=pos, op=nl.add)
    nisa.dma_copy(dst=out, src=n)
    return out


def staged_through_private_hbm(x):
    """Data staged through the kernel's own HBM scratch (written in two halves, read back
    whole), then scaled; a second scratch tensor is read before it is written."""
    out = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    scratch = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(dst=scratch[:, :F // 2], src=x[:, :F // 2])
    nisa.dma_copy(dst=scratch[:, F // 2:], src=x[:, F // 2:])
    unset = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.private_hbm)
    t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=scratch)
    u = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=u, src=unset)
    r = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=r, data=t, op0=nl.multiply, operand0=2.0, op1=nl.add, operand1=u)
    nisa.dma_copy(dst=out, src=r)
    return out


def reinterpreted_memory(bits, y):
    """bf16 values arriving as uint16 bits, read through ``.ap(dtype=)``; an SBUF tile's
    float32 bits read as int32 through ``.view``; an output written through a
    reinterpretation of itself (uint16 storage written as bf16)."""
    ints = nl.ndarray((P, 64), dtype=nl.int32, buffer=nl.shared_hbm)
    halves = nl.ndarray((P, 64), dtype=nl.uint16, buffer=nl.shared_hbm)
    t = nl.ndarray((P, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=bits.ap(pattern=[[64, P], [1, 64]], dtype=nl.bfloat16))
    s = nl.ndarray((P, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=s, op=nl.exp, data=t)
    yt = nl.ndarray((P, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=yt, src=y)
    nisa.tensor_tensor(dst=s, data1=s, data2=yt, op=nl.add)
    nisa.dma_copy(dst=ints, src=s.view(nl.int32))
    nisa.dma_copy(dst=halves.ap(pattern=[[64, P], [1, 64]], dtype=nl.bfloat16), src=s)
    return ints, halves


def shuffled_partitions(x):
    """Partitions moved within each quadrant of 32 (some kept), in place and into another tile."""
    out = nl.ndarray((P, 64), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((P, 64), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    mask = [31 - i if i % 3 else 255 for i in range(32)]
    nisa.nc_stream_shuffle(t, t, mask)
    u = nl.ndarray((P, 64), dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=u, value=1.5)
    nisa.nc_stream_shuffle(src=t, dst=u, shuffle_mask=[(i + 5) % 32 for i in range(32)])
    nisa.dma_copy(dst=out, src=u)
    return out


def masks_and_top8(x):
    """A causal mask by 0.x affine_select, iota in both forms, the 8 largest values per
    partition, and an instruction given a positional dst with keyword operands."""
    out = nl.ndarray((P, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    top = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    masked = nl.ndarray((P, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=masked, pattern=[[-1, 64]], offset=0, channel_multiplier=1, on_true_tile=t,
                       on_false_value=-9984.0, cmp_op=nl.greater_equal)
    cols = nl.ndarray((P, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(cols, [[1, 64]], 0, 2)
    rows = nisa.iota(nl.arange(P)[:, None] + nl.arange(64)[None, :] * 0, dtype=nl.float32)
    nisa.tensor_tensor(masked, data1=masked, data2=cols, op=nl.add)
    nisa.tensor_tensor(dst=masked, data1=masked, data2=rows, op=nl.subtract)
    nisa.dma_copy(dst=out, src=masked)
    best = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=best, src=t)
    nisa.dma_copy(dst=top, src=best)
    return out, top


def scans_and_sums(x, y):
    """A running sum along the free axis (tensor_tensor_scan), exp with its row sums
    (activation_reduce), positions of the 8 largest values (nc_find_index8), two tensors summed
    by the DMA engines into HBM (dma_compute), a constant, and a result tile's rounded bits
    read through a reinterpretation."""
    cums = nl.ndarray((P, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    sums = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    where = nl.ndarray((P, 8), dtype=nl.uint32, buffer=nl.shared_hbm)
    both = nl.ndarray((P, 64), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    bits = nl.ndarray((P, 64), dtype=nl.int16, buffer=nl.shared_hbm)
    t = nl.ndarray((P, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    ones = nl.ndarray((P, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    c = nl.ndarray((P, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor_scan(dst=c, data0=ones, data1=t, initial=0.0, op0=nl.multiply, op1=nl.add)
    nisa.dma_copy(dst=cums, src=c)
    e = nl.ndarray((P, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
    s = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=e, op=nl.exp, data=t, reduce_op=nl.add, reduce_res=s)
    nisa.dma_copy(dst=sums, src=s)
    top = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=top, src=t)
    idx = nl.ndarray((P, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=idx, data=t, vals=top)
    nisa.dma_copy(dst=where, src=idx)
    k = nl.shared_constant(np.linspace(-1, 1, P * 64).reshape(P, 64), dtype=nl.bfloat16)
    nisa.dma_compute(both, [x, y, k], nl.add)
    nisa.dma_copy(dst=bits, src=e.ap(pattern=[[64, P], [1, 64]], dtype=nl.int16))
    return cums, sums, where, both, bits


def selections(x, lo, hi):
    """Elements whose free index lies in per-partition ranges kept (range_select, with the
    maximum of what it keeps), |x| - 1 by tensor_scalar with a unary operator, and a
    scaled copy with its row sums (tensor_scalar_reduce)."""
    kept = nl.ndarray((P, 64), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    best = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    mag = nl.ndarray((P, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    sums = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    b0 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=b0, src=lo)
    b1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=b1, src=hi)
    k = nl.ndarray((P, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
    m = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.range_select(dst=k, on_true_tile=t, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=b0, bound1=b1,
                      range_start=2.0, on_false_value=-1e4, reduce_res=m, reduce_op=nl.maximum)
    nisa.dma_copy(dst=kept, src=k)
    nisa.dma_copy(dst=best, src=m)
    a = nl.ndarray((P, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=a, data=t, op0=nl.abs, operand0=0.0, op1=nl.subtract, operand1=1.0)
    nisa.dma_copy(dst=mag, src=a)
    s = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_reduce(dst=a, data=t, op0=nl.multiply, operand0=b1, reduce_op=nl.add, reduce_res=s)
    nisa.dma_copy(dst=sums, src=s)
    return kept, best, mag, sums


def psum_bits(a, b):
    """A matmul's float32 PSUM result read as int32 bits through ``.ap(dtype=)``."""
    out = nl.ndarray((P, 64), dtype=nl.int32, buffer=nl.shared_hbm)
    ta = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a)
    tb = nl.ndarray((P, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=tb, src=b)
    acc = nl.ndarray((P, 64), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=ta, moving=tb)
    bits = nl.ndarray((P, 64), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=bits, src=acc.ap(pattern=[[64, P], [1, 64]], dtype=nl.int32))
    nisa.dma_copy(dst=out, src=bits)
    return out


def transposed_reciprocals(x):
    """A tile transposed by the DMA engines (HBM to SBUF, and SBUF to HBM), and 1/x."""
    out = nl.ndarray((64, P), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    inv = nl.ndarray((P, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((64, P), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    u = nl.ndarray((P, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_transpose(u, t)
    r = nl.ndarray((P, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=r, data=u)
    nisa.dma_copy(dst=inv, src=r)
    return out, inv


@pytest.fixture
def rng():
    return np.random.default_rng(5)


def normal(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def test_memset(rng):
    check_lowered(row_sums_with_memset, lambda: [normal(rng, (P, F), ml_dtypes.bfloat16)])
    check_lowered(counts_with_integer_memset, lambda: [normal(rng, (P, 64))])


@pytest.mark.parametrize("debug", [False, True], ids=["zeros", "debug-fill"])
def test_private_hbm_scratch(rng, debug):
    check_lowered(staged_through_private_hbm, lambda: [normal(rng, (P, F), ml_dtypes.bfloat16)], debug=debug)


def test_reinterpreted_memory(rng):
    bits = lambda: normal(rng, (P, 64), ml_dtypes.bfloat16).view(np.uint16)  # noqa: E731
    check_lowered(reinterpreted_memory, lambda: [bits(), normal(rng, (P, 64))])


def test_stream_shuffle(rng):
    check_lowered(shuffled_partitions, lambda: [normal(rng, (P, 64), ml_dtypes.bfloat16)])


def test_index_values_and_max8(rng):
    check_lowered(masks_and_top8, lambda: [normal(rng, (P, 64))])


def test_scans_reductions_and_dma_compute(rng):
    check_lowered(scans_and_sums, lambda: [normal(rng, (P, 64)), normal(rng, (P, 64))])


def test_selections_and_scalar_reductions(rng):
    def args():
        lo = rng.integers(0, 40, (P, 1)).astype(np.float32)
        return [normal(rng, (P, 64)), lo, lo + rng.integers(1, 30, (P, 1)).astype(np.float32)]
    check_lowered(selections, args)


def test_psum_reinterpreted(rng):
    check_lowered(psum_bits, lambda: [normal(rng, (P, P)), normal(rng, (P, 64))])


def test_dma_transpose_and_reciprocal(rng):
    check_lowered(transposed_reciprocals, lambda: [normal(rng, (P, 64), ml_dtypes.bfloat16)])
