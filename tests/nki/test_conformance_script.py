"""The conformance script on a checkout laid out as nki-samples, with drivers and kernels written here."""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

KERNELS = '''
import numpy as np
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def doubles(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(a) * 2.0)
    return out


@nki.jit
def off_by_one(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(a) * 2.0 + 1.0)
    return out


@nki.jit
def never_called(a):
    return a


if __name__ == "__main__":
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    for k in (doubles, off_by_one):
        print("NKI and NumPy match" if np.allclose(k(x), 2 * x) else "NKI and NumPy differ")
'''

TORCH_DRIVER = '''
import torch
from torch_xla.core import xla_model as xm
from neuronxcc.nki.docs.examples.demo.demo_nki_kernels import doubles

device = xm.xla_device()
x = torch.arange(64, dtype=torch.float32).reshape(8, 8).to(device)
assert torch.allclose(doubles(x).cpu(), 2 * x.cpu())
'''


def test_one_line_per_kernel_and_the_totals(tmp_path):
    tut = tmp_path / "src" / "nki_samples" / "tutorials" / "demo"
    tut.mkdir(parents=True)
    (tut / "demo_nki_kernels.py").write_text(textwrap.dedent(KERNELS))
    (tut / "demo_torch.py").write_text(textwrap.dedent(TORCH_DRIVER))
    (tut / "demo_jax.py").write_text("import jax\n")
    r = subprocess.run([sys.executable, "-m", "torchneuron.nki.conformance", str(tmp_path)], capture_output=True,
                       text=True, timeout=600, cwd=str(tmp_path),
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT] + sys.path)})
    lines = r.stdout.splitlines()
    by_kernel = {next(w for w in line.split() if "::" in w).split("::")[1]: line for line in lines if "::" in line}
    assert set(by_kernel) == {"doubles", "off_by_one", "never_called"}, r.stdout + r.stderr
    assert by_kernel["doubles"].startswith("  PASS ")
    assert "numpy:demo_nki_kernels.py" in by_kernel["doubles"] and "torch:demo_torch.py" in by_kernel["doubles"]
    assert by_kernel["off_by_one"].startswith("  FAIL ") and "NKI and NumPy differ" in by_kernel["off_by_one"]
    assert by_kernel["never_called"].startswith("  NOT RUN")
    assert "[neuronxcc.nki]" in by_kernel["doubles"]
    assert any(line.startswith("  SKIP    demo/demo_jax.py") for line in lines)
    assert any("1/3 kernels pass, 1 fail, 1 not run" in line for line in lines), r.stdout
    assert r.returncode == 1
    assert not (tut / "file.neff").exists()      # drivers run on a scratch copy
