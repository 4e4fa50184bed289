"""Upstream import names, and coverage of the nki.language / nki.isa surface."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

LANGUAGE_NAMES = """ndarray zeros full ones shared_constant par_dim sbuf psum hbm private_hbm shared_hbm load
store copy load_transpose2d arange mgrid ds tile_size affine_range sequential_range static_range
loop_reduce program_id program_ndim num_programs spmd_dim nc multiply max add exp matmul sum subtract
divide rsqrt square floor maximum minimum mean abs equal dropout random_seed log transpose where min
mod float32 bfloat16 float16 int32 uint8 int8 uint32 float8_e4m3 float8_e5m2 tfloat32 bool_ int16
uint16 static_cast""".split()

ISA_NAMES = """nc_matmul tensor_reduce tensor_copy activation nc_transpose tensor_scalar reciprocal
tensor_scalar_reduce tensor_tensor affine_select activation_reduce dma_copy tensor_tensor_scan
scalar_tensor_tensor dma_transpose iota bn_stats bn_aggr tensor_partition_reduce memset vector_engine
scalar_engine gpsimd_engine tensor_engine""".split()


def test_surface_is_complete():
    assert [n for n in LANGUAGE_NAMES if not hasattr(nl, n)] == []
    assert [n for n in ISA_NAMES if not hasattr(nisa, n)] == []


def test_upstream_imports_run_unchanged(tmp_path):
    # a fresh interpreter, so the aliases do not leak into other tests
    script = tmp_path / "kernel_user.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import torchneuron.nki
        torchneuron.nki.install_import_aliases()

        import neuronxcc.nki as nki
        import neuronxcc.nki.language as nl
        import neuronxcc.nki.typing as nt
        from neuronxcc.nki.language import par_dim
        import nki.isa as nisa

        @nki.jit
        def double(x):
            out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
            t: nt.tensor[x.shape] = nl.load(x)
            nl.store(out, value=nisa.tensor_scalar(t, np.multiply, 2.0))
            return out

        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        assert (double(x) == 2 * x).all()
        print("ok")
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       cwd=str(tmp_path), env={"PYTHONPATH": ":".join(sys.path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_import_nki_finds_the_emulator_unless_nki_is_installed(tmp_path):
    """TorchNeuron programs `import nki` with no opt-in: answered by this package (the same module objects,
    no second copy of a submodule), unless an installed nki exists, which wins."""
    code = textwrap.dedent("""
        import torch, sys
        import nki, nki.language as nl, nki.isa as nisa
        import torchneuron.nki as tn
        print(nki is tn and nl is tn.language and nisa is tn.isa and nl.__name__ == "torchneuron.nki.language",
              getattr(nki, "REAL", False))
    """)
    env = {"PYTHONPATH": ":".join(sys.path)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and r.stdout.split() == ["True", "False"], r.stderr
    (tmp_path / "nki").mkdir()
    (tmp_path / "nki" / "__init__.py").write_text("REAL = True\n")
    (tmp_path / "nki" / "language.py").write_text("")
    (tmp_path / "nki" / "isa.py").write_text("")
    env = {"PYTHONPATH": ":".join([str(tmp_path), *sys.path])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and r.stdout.split() == ["False", "True"], r.stderr


@nki.jit
def isa_tour(x, y):
    out = nl.ndarray((9, x.shape[0], x.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    a, b = nl.load(x), nl.load(y)
    p, f = x.shape
    nl.store(out[0], value=nisa.tensor_tensor_scan(a, b, 0.0, np.multiply, np.add))   # r = a*r + b
    red = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    nl.store(out[1], value=nisa.tensor_scalar_reduce(data=a, op0=np.add, operand0=1.0,
                                                     reduce_op=np.add, reduce_res=red))
    nl.store(out[2], value=red.broadcast_to((p, f)))
    nl.store(out[3], value=nisa.tensor_partition_reduce(np.add, a).broadcast_to((p, f)))
    nl.store(out[4], value=nisa.iota(nl.arange(p)[:, None] * 100 + nl.arange(f)[None, :], nl.float32))
    i = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(i, [[1, f]], 5, 100)                                                   # 0.x form
    nl.store(out[5], value=i)
    nl.store(out[6], value=nisa.reciprocal(b))
    m = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(m, 7.0)
    nl.store(out[7], value=nl.where(nl.greater(a, b), a, m))
    acc = nl.zeros((p, f), dtype=nl.float32, buffer=nl.sbuf)
    for k in nl.affine_range(3):
        acc = nl.loop_reduce(a, op=np.add, loop_indices=[k])
    nl.store(out[8], value=acc)
    return out


def test_isa_tour(rng):
    x = rng.uniform(0.5, 1.5, (8, 16)).astype(np.float32)
    y = rng.uniform(0.5, 1.5, (8, 16)).astype(np.float32)
    out = isa_tour(x, y)
    scan = np.zeros_like(x)
    r = np.zeros(8, np.float32)
    for j in range(16):
        r = x[:, j] * r + y[:, j]
        scan[:, j] = r
    np.testing.assert_allclose(out[0], scan, rtol=1e-5)
    np.testing.assert_allclose(out[1], x + 1, rtol=1e-6)
    np.testing.assert_allclose(out[2], np.broadcast_to((x + 1).sum(axis=1, keepdims=True), x.shape), rtol=1e-5)
    np.testing.assert_allclose(out[3], np.broadcast_to(x.sum(axis=0), x.shape), rtol=1e-5)
    np.testing.assert_array_equal(out[4], np.arange(8)[:, None] * 100 + np.arange(16)[None, :])
    np.testing.assert_array_equal(out[5], 5 + np.arange(8)[:, None] * 100 + np.arange(16)[None, :])
    np.testing.assert_allclose(out[6], 1 / y, rtol=1e-6)
    np.testing.assert_array_equal(out[7], np.where(x > y, x, 7.0))
    np.testing.assert_allclose(out[8], 3 * x, rtol=1e-6)


def test_transposes_and_affine_select_0x(rng):
    @nki.jit
    def k(x):
        out = nl.ndarray((3, x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        tp = nl.ndarray((x.shape[1], x.shape[0]), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(tp, t)
        nl.store(out[0], value=nisa.tensor_copy(tp))
        nl.store(out[1], value=nisa.dma_transpose(t))
        sel = nl.ndarray((x.shape[1], x.shape[0]), dtype=nl.float32, buffer=nl.sbuf)
        # keep element (i, j) where j - i >= 0 (upper triangle), else -1
        nisa.affine_select(sel, [[1, x.shape[0]]], 0, -1, nisa.tensor_copy(tp), -1.0, cmp_op=np.greater_equal)
        nl.store(out[2], value=sel)
        return out

    x = rng.standard_normal((16, 24)).astype(np.float32)
    out = k(x)
    np.testing.assert_array_equal(out[0], x.T)
    np.testing.assert_array_equal(out[1], x.T)
    i, j = np.mgrid[0:24, 0:16]
    np.testing.assert_array_equal(out[2], np.where(j - i >= 0, x.T, -1.0))
