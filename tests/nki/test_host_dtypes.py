"""``host_dtypes`` (the ``neuron_dtypes`` interface): casts with the device's rounding, MX x4 packing
on host arrays, and dtype facts, against ml_dtypes."""
import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import host_dtypes as dt


def test_casts_round_to_nearest_even_and_saturate_integers(rng):
    x = rng.standard_normal(1000).astype(np.float32) * 300
    np.testing.assert_array_equal(dt.static_cast(x, nl.bfloat16), x.astype(ml_dtypes.bfloat16))
    np.testing.assert_array_equal(dt.static_cast(np.array([300.0, -300.0, 1.5, 2.5]), nl.int8), [127, -128, 2, 2])


def test_mx_x4_packs_four_values_of_the_last_axis(rng):
    x = rng.standard_normal((8, 16)).astype(np.float32)
    packed = dt.static_cast(x, nl.float8_e4m3fn_x4)
    assert packed.shape == (8, 4) and packed.dtype == np.uint32
    unpacked = nl.float8_e4m3fn_x4.unpack(packed).reshape(8, 16)
    np.testing.assert_array_equal(unpacked, x.astype(ml_dtypes.float8_e4m3fn).astype(np.float32))
    with pytest.raises(ValueError, match="multiple of 4"):
        dt.static_cast(np.zeros((2, 6), np.float32), nl.float4_e2m1fn_x4)


def test_sizes_kinds_and_limits():
    assert dt.sizeinbytes(nl.bfloat16) == 2 and dt.sizeinbytes(nl.float8_e5m2_x4) == 4
    assert dt.is_float_type(nl.float8_e4m3) and dt.is_float_type(nl.float4_e2m1fn_x4)
    assert not dt.is_float_type(np.int32)
    assert dt.finfo(nl.float8_e4m3fn).max == 448 and dt.finfo(nl.float8_e5m2_x4).max == 57344
    with pytest.raises(TypeError, match="not a floating-point type"):
        dt.finfo(np.int8)


@nki.jit(target="trn3")
def pass_through(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=x)
    return out


def test_packed_host_arrays_keep_their_type_through_a_kernel_and_unpack(rng):
    x = rng.standard_normal((8, 16)).astype(np.float32)
    packed = dt.static_cast(x, nl.float8_e5m2_x4)
    assert packed.packed is nl.float8_e5m2_x4 and packed[2:4].packed is nl.float8_e5m2_x4
    out = pass_through(packed)
    assert out.packed is nl.float8_e5m2_x4 and out.dtype == np.uint32
    np.testing.assert_array_equal(out.view(np.ndarray), packed.view(np.ndarray))
    back = dt.static_cast(out, np.float32)
    assert back.shape == (8, 16)
    np.testing.assert_array_equal(back, x.astype(ml_dtypes.float8_e5m2).astype(np.float32))
    assert type(packed + 1) is np.ndarray  # arithmetic on storage integers is not a pack


@nki.jit
def copy_as_given(x):
    """A copy of x in x's own type, through an SBUF tile of that type."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_arrays_made_with_an_x4_dtype_are_of_that_type(rng):
    x = np.zeros((32, 4), dtype=nl.float8_e4m3fn_x4)  # storage integers, tagged with the type
    x[...] = rng.integers(0, 2 ** 32, x.shape, dtype=np.uint32)
    got = copy_as_given(x)
    assert got.packed is nl.float8_e4m3fn_x4
    np.testing.assert_array_equal(got.view(np.ndarray), x)
    assert copy_as_given(np.zeros((32, 4), np.uint32)).dtype == np.uint32  # plain integers stay integers
