"""The language names and Python semantics AWS's NKI Library relies on, with kernels written here:
configuration objects (``nl.NKIObject``), the type names (``nl.tensor``, ``nl.dtype``, ``nl.bool``,
``nki.dtype``), ``nki.isa.constants``, ``nl.range``, and optional tensors tested in Python
conditions (``if bias:``, ``bias != None``)."""
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki.errors import NKITypeError


@dataclass(frozen=True)
class ScaleConfig(nl.NKIObject):
    scale: float = 2.0
    add_bias: bool = True


@nki.jit
def scaled(x, bias, config: ScaleConfig, out_dtype: nki.dtype = nl.float32):
    out = nl.ndarray(x.shape, dtype=out_dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=config.scale)
    if bias != None and config.add_bias:  # noqa: E711  (the library's spelling)
        b = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=b, src=bias)
        nisa.tensor_tensor(dst=t, data1=t, data2=b, op=nl.add)
    for i in nl.range(1):
        nisa.dma_copy(dst=out, src=t)
    return out


def test_configuration_objects_and_optional_tensors():
    x = np.arange(32 * 8, dtype=np.float32).reshape(32, 8)
    b = np.ones_like(x)
    np.testing.assert_array_equal(scaled(x, b, ScaleConfig()), 2 * x + 1)
    np.testing.assert_array_equal(scaled(x, None, ScaleConfig(scale=3.0)), 3 * x)
    np.testing.assert_array_equal(scaled(x, b, ScaleConfig(add_bias=False)), 2 * x)
    half = scaled(x, b, ScaleConfig(), out_dtype=nl.float16)
    assert half.dtype == np.float16
    np.testing.assert_array_equal(half, (2 * x + 1).astype(np.float16))


@nki.jit
def truth_of_a_comparison(x):
    t = nl.load(x)
    if t > 0:
        nl.store(x, value=t)
    return x


def test_tensors_are_true_and_comparisons_of_values_have_no_truth():
    assert isinstance(nl.float32, nl.dtype) and isinstance(nl.float8_e4m3fn_x4, nl.dtype)
    assert not isinstance(np.float32, nl.dtype) and nl.bool == np.bool_
    assert nl.tensor is nki.NkiTensor and nki.dtype.float8_e4m3 is nl.float8_e4m3
    with pytest.raises(NKITypeError, match="comparison has no truth value"):
        truth_of_a_comparison(np.ones((4, 4), np.float32))


def test_nested_module_names_isa_constants_and_collectives():
    code = textwrap.dedent("""
        import torchneuron.nki
        import nki.isa.constants as constants
        from nki.isa.constants import dge_mode, oob_mode
        import nki.isa as nisa
        assert constants.oob_mode is nisa.oob_mode and dge_mode is nisa.dge_mode
        assert list(oob_mode.__members__) == ["error", "skip"]
        import nki.dtype as nt
        import nki.language as nl
        assert nt.float8_e4m3 == nl.float8_e4m3
        from nki.collectives import ReplicaGroup
        import nki.collectives
        assert nki.collectives.rank_id() == 0
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "ok", r.stderr


def test_nc_versions_are_ordered_and_compare_with_integers():
    assert nisa.nc_version.gen2 < nisa.nc_version.gen3 < nisa.nc_version.gen4
    assert nisa.nc_version.gen3 >= 3 and nisa.nc_version.gen3.name == "gen3"


@nki.jit
def identity_and_constant(x, path):
    n = x.shape[0]
    out = nl.ndarray((2, n, n), dtype=nl.float32, buffer=nl.shared_hbm)
    eye = nl.shared_identity_matrix(n, dtype=nl.bfloat16)  # an SBUF tile
    t = nl.ndarray((n, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    p = nl.ndarray((n, n), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=p, stationary=eye, moving=t)
    nisa.tensor_copy(dst=t, src=p)
    nisa.dma_copy(dst=out[0], src=t)
    nisa.dma_copy(dst=out[1], src=nl.shared_constant(path))
    return out


def test_identity_is_an_sbuf_tile_and_constants_load_from_npy_files(rng, tmp_path):
    x = rng.standard_normal((16, 16)).astype(np.float32)
    c = rng.standard_normal((16, 16)).astype(np.float32)
    np.save(tmp_path / "c.npy", c)
    got = identity_and_constant(x, str(tmp_path / "c.npy"))
    np.testing.assert_allclose(got[0], x, rtol=1e-6)
    np.testing.assert_array_equal(got[1], c)
    with pytest.raises(NKITypeError, match="cannot read a .npy array"):
        identity_and_constant(x, str(tmp_path / "missing.npy"))


@nki.jit
def abs_max(x):
    P, F = x.shape
    out = nl.ndarray((P, F + 1), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    m = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar_reduce(dst=t, data=t, op0=nl.abs, operand0=0.0, reduce_op=nl.maximum, reduce_res=m)
    nisa.dma_copy(dst=out[:, 0:F], src=t)
    nisa.dma_copy(dst=out[:, F:F + 1], src=m)
    return out


def test_a_unary_operator_in_tensor_scalar_applies_to_the_data(rng):
    x = rng.standard_normal((8, 32)).astype(np.float32)
    got = abs_max(x)
    np.testing.assert_array_equal(got[:, :32], np.abs(x))
    np.testing.assert_array_equal(got[:, 32], np.abs(x).max(axis=1))


@dataclass
class Unannotated(nl.NKIObject):
    offset = None  # a class attribute, not a dataclass field
    active = False


@dataclass
class Partial(nl.NKIObject):
    rows: int
    cols: int

    def __post_init__(self):
        self.size = self.rows * getattr(self, "cols", 1)


def test_nki_objects_take_declared_attributes_by_keyword():
    u = Unannotated(offset=4, active=True)
    assert (u.offset, u.active) == (4, True) and Unannotated().offset is None
    p = Partial(rows=3)  # a field left out: the object is built from the keywords given
    assert p.rows == 3 and p.size == 3 and not hasattr(p, "cols")
    assert Partial(2, 5).size == 10  # arguments that fit the dataclass use its __init__
    with pytest.raises(TypeError, match=r"has no attribute\(s\) \['colour'\]"):
        Partial(rows=1, colour=2)


class Plain(nl.NKIObject):
    """Not a dataclass: annotations only, as the library's configuration classes."""
    io_dtype: object
    accumulate: bool = False


def test_a_plain_nki_object_takes_its_annotated_attributes():
    p = Plain(io_dtype=nl.bfloat16)
    assert p.io_dtype == nl.bfloat16 and p.accumulate is False
