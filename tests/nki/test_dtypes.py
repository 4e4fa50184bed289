"""Data types, rounding (nearest-even) and float32 internal arithmetic."""
import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import dtypes


def test_bf16_round_to_nearest_even():
    # 1 + 2^-8 is exactly between bf16 neighbours 1 and 1 + 2^-7: ties go to even (1.0)
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20], np.float32)
    r = dtypes.from_compute(x, nl.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(r, [1.0, 1 + 2 ** -6, 1 + 2 ** -7])


def test_bf16_rounding_gives_ml_dtypes_bits_for_every_kind_of_float32():
    """from_compute's own loop (torchneuron._C) against ml_dtypes' cast: random bit
    patterns, every NaN payload class of both signs, infinities, subnormals, ties,
    overflow, and a strided array (which takes the cast itself)."""
    rng = np.random.default_rng(7)
    special = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF,
               0x00008000, 0x00018000, 0x00000001, 0x807FFFFF, 0x3F808000, 0x3F818000, 0x3F807FFF]
    bits = np.concatenate([rng.integers(0, 2 ** 32, 1_000_000, dtype=np.uint64).astype(np.uint32),
                           np.array(special, np.uint32),
                           np.arange(0x7F800001, 0x7F800001 + 40000, 97, dtype=np.uint32),
                           np.arange(0xFF800001, 0xFFFFFFFF, 4099, dtype=np.uint32)])
    x = bits.view(np.float32)
    with np.errstate(invalid="ignore"):
        want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
        assert dtypes.ROUND_TO_BF16 is not None
        assert np.array_equal(dtypes.from_compute(x, nl.bfloat16).view(np.uint16), want)
        strided = x.reshape(-1, 5)[:, ::2]
        assert np.array_equal(dtypes.from_compute(strided, nl.bfloat16).view(np.uint16),
                              strided.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_bf16_rounding_into_rows_of_a_larger_array(rng):
    # as a tile's store into a region of HBM: only the region changes
    if dtypes.ROUND_TO_BF16 is None:
        pytest.skip("the emulator without the extension")
    x = rng.standard_normal((128, 96)).astype(np.float32)
    big = np.full((130, 200), 7, np.uint16).view(ml_dtypes.bfloat16)
    dtypes.ROUND_TO_BF16(x, big[1:129, 50:146])
    want = np.full((130, 200), 7, np.uint16)
    want[1:129, 50:146] = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(big.view(np.uint16), want)
    for bad in (big[1:129, 50:242:2], big[:128, :95], big[:128, :96].T):
        with pytest.raises(RuntimeError, match="contiguous rows"):
            dtypes.ROUND_TO_BF16(x, bad)


def test_tf32_rounding():
    x = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -11 + 2 ** -20, np.inf], np.float32)
    r = dtypes.from_compute(x, nl.tfloat32)
    np.testing.assert_array_equal(r, [1.0, 1 + 2 ** -9, 1 + 2 ** -10, np.inf])


def test_float8_formats():
    assert ml_dtypes.finfo(nl.float8_e4m3).max == 240
    assert ml_dtypes.finfo(nl.float8_e5m2).max == 57344
    r = dtypes.from_compute(np.array([1.0625, 1.1875], np.float32), nl.float8_e4m3).astype(np.float32)
    np.testing.assert_array_equal(r, [1.0, 1.25])  # ties to even on a 3-bit mantissa


def test_int_conversion_rounds_and_saturates():
    r = dtypes.from_compute(np.array([2.5, 3.5, -2.5, 300.0, -300.0, np.nan], np.float32), nl.int8)
    np.testing.assert_array_equal(r, [2, 4, -2, 127, -128, 0])
    assert dtypes.from_compute(np.array([70000.0], np.float32), nl.uint16)[0] == 65535


def test_bool_and_static_cast():
    np.testing.assert_array_equal(dtypes.from_compute(np.array([0.0, 2.0]), nl.bool_), [False, True])
    x = nl.static_cast(np.array([1.0, 2 ** -9 + 1.0]), nl.bfloat16)
    assert x.dtype == nl.bfloat16


@pytest.mark.parametrize("dtype", [nl.int8, nl.int16, nl.int32, nl.uint8, nl.uint16, nl.uint32,
                                   nl.float16, nl.bfloat16, nl.float32, nl.float8_e4m3, nl.float8_e5m2])
def test_every_dtype_round_trips_through_a_kernel(dtype):
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.add(nl.load(x), 1))
        return out

    x = np.arange(24).reshape(4, 6).astype(dtype)
    out = k(x)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, (x.astype(np.float32) + 1).astype(dtype))


def test_float32_internal_arithmetic_single_rounding():
    # bf16 inputs, fp32 output: exp is computed in fp32 and rounded once to the
    # destination, not to bf16 first
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        t[...] = nl.exp(nl.load(x))          # result tile is bf16, assignment uses the fp32 value
        nl.store(out, value=t)
        return out

    x = np.linspace(-2, 2, 32).reshape(4, 8).astype(nl.bfloat16)
    np.testing.assert_allclose(k(x), np.exp(x.astype(np.float32)), rtol=1e-6)


def test_psum_accumulates_in_fp32():
    @nki.jit
    def k(a):
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        acc = nl.zeros((1, 1), dtype=nl.float32, buffer=nl.psum)
        for i in nl.affine_range(300):
            acc += nisa.nc_matmul(t, t)     # 1 * 1 each time; bf16 could not count past 256
        nl.store(out, value=nisa.tensor_copy(acc))
        return out

    assert k(np.ones((1, 1), nl.bfloat16))[0, 0] == 300.0
