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
    assert nl.tensor is nki.NkiTensor and nki.dtype is nl.dtype
    with pytest.raises(NKITypeError, match="comparison has no truth value"):
        truth_of_a_comparison(np.ones((4, 4), np.float32))


def test_isa_constants_module_names_the_isa_enumerations():
    code = textwrap.dedent("""
        import torchneuron.nki
        import nki.isa.constants as constants
        from nki.isa.constants import dge_mode, oob_mode
        import nki.isa as nisa
        assert constants.oob_mode is nisa.oob_mode and dge_mode is nisa.dge_mode
        assert list(oob_mode.__members__) == ["error", "skip"]
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "ok", r.stderr
