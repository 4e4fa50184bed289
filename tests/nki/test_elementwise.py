"""Tensor addition with an SPMD grid, in both language generations."""
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


@nki.jit
def add_beta1(a, b):
    # one 128 x 512 tile per program, indexed with index grids
    c = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    rows = nl.program_id(0) * 128 + nl.arange(128)[:, None]
    cols = nl.program_id(1) * 512 + nl.arange(512)[None, :]
    a_t = nl.load(a[rows, cols])
    b_t = nl.load(b[rows, cols])
    nl.store(c[rows, cols], value=a_t + b_t)
    return c


@nki.jit
def add_nki0(a, b):
    # destination-first ISA calls and plain slices
    c = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    r0 = nl.program_id(0) * 128
    c0 = nl.program_id(1) * 512
    a_t = nl.ndarray((128, 512), dtype=a.dtype, buffer=nl.sbuf)
    b_t = nl.ndarray((128, 512), dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_t, src=a[r0:r0 + 128, c0:c0 + 512])
    nisa.dma_copy(dst=b_t, src=b[r0:r0 + 128, c0:c0 + 512])
    s = nl.ndarray((128, 512), dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=s, data1=a_t, data2=b_t, op=np.add)
    nisa.dma_copy(dst=c[r0:r0 + 128, c0:c0 + 512], src=s)
    return c


@pytest.mark.parametrize("kernel", [add_beta1, add_nki0])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, nl.bfloat16])
def test_spmd_add(kernel, dtype, rng):
    a = rng.standard_normal((256, 1024)).astype(dtype)
    b = rng.standard_normal((256, 1024)).astype(dtype)
    out = kernel[2, 2](a, b)
    assert out.dtype == np.dtype(dtype)
    # the engine adds in float32 and rounds once to the output type
    ref = (a.astype(np.float32) + b.astype(np.float32)).astype(dtype)
    np.testing.assert_array_equal(out, ref)


def test_grid_queries():
    seen = []

    @nki.jit
    def probe(x):
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        seen.append((nl.program_id(0), nl.program_id(1), nl.num_programs(0), nl.num_programs(1),
                     nl.num_programs(), nl.program_ndim()))
        return out

    probe[nl.spmd_dim(nl.nc(2), 1), 3](np.zeros((1, 1), np.float32))
    assert seen == [(i, j, 2, 3, 6, 2) for i in range(2) for j in range(3)]


def test_outputs_shared_and_tuples(rng):
    @nki.jit
    def two_outputs(x):
        y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        z = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        t = nl.load(x[i * 128:(i + 1) * 128, :])
        nl.store(y[i * 128:(i + 1) * 128, :], value=nl.multiply(t, 2.0))
        nl.store(z[i * 128:(i + 1) * 128, :], value=nl.exp(t))
        return y, z

    x = rng.standard_normal((384, 64)).astype(np.float32)
    y, z = two_outputs[3](x)
    np.testing.assert_array_equal(y, 2 * x)
    np.testing.assert_allclose(z, np.exp(x), rtol=1e-6)


def test_inputs_are_not_copied(rng):
    @nki.jit
    def scale_in_place(x):
        t = nl.load(x)
        nl.store(x, value=t * 3.0)

    x = rng.standard_normal((128, 16)).astype(np.float32)
    ref = 3 * x
    scale_in_place(x)
    np.testing.assert_array_equal(x, ref)


def test_strided_input_staged_and_written_back(rng):
    @nki.jit
    def negate(x):
        nl.store(x, value=-nl.load(x))

    base = rng.standard_normal((64, 32)).astype(np.float32)
    view = base[:, ::2]
    ref = -view.copy()
    negate(view)
    np.testing.assert_array_equal(view, ref)
