"""The NKI Library runner (``python -m torchneuron.nki.library``) on a checkout laid out as
aws-neuron/nki-library, written by this test: a conftest with the suite's simulation options that
imports ``nki_cpu_simulator`` as the library's harness does, a kernel family whose kernels use the
library's names, one passing and one failing case, and a family whose module does not import."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

CONFTEST = '''
import os
import sys
import pytest

def pytest_addoption(parser):
    parser.addoption("--test-mode", default="compile-only")
    parser.addoption("--platform-target", default="trn2")
    parser.addoption("--output-directory", default="out")

def pytest_configure(config):
    if config.getoption("--test-mode") == "simulation":
        import nki_cpu_simulator.nki.isa.constants as constants
        import nki_cpu_simulator.nki.language as nl
        from nki_cpu_simulator import nki
        sys.modules["nki"], sys.modules["nki.language"] = nki, nl
        sys.modules["nki.isa.constants"] = constants
        os.environ["NKI_NC_VERSION"] = {"trn2": "gen3", "trn3": "gen4"}[config.getoption("--platform-target")]

@pytest.fixture
def simulate():
    def run(kernel, lnc=1, **inputs):
        import nki
        return nki.cpu_simulate(kernel)[lnc](**inputs)
    return run
'''

KERNEL = '''
from dataclasses import dataclass
import nki
import nki.isa as nisa
import nki.language as nl


@dataclass(frozen=True)
class Config(nl.NKIObject):
    scale: float = 2.0


@nki.jit
def scale_rows(x, bias, config: Config):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=config.scale)
    if bias != None:
        b = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=b, src=bias)
        nisa.tensor_tensor(dst=t, data1=t, data2=b, op=nl.add)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def generation(x):
    out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
    t = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=int(nisa.get_nc_version()))
    nisa.dma_copy(dst=out, src=t)
    return out
'''

TEST = '''
import numpy as np
import pytest
from nkilib_src.nkilib.core.demo.kernel import Config, generation, scale_rows


@pytest.mark.parametrize("rows", [8, 64])
def test_scale_rows(simulate, rows):
    x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    np.testing.assert_array_equal(simulate(scale_rows, x=x, bias=None, config=Config()), 2 * x)


def test_scale_rows_against_a_wrong_reference(simulate):
    x = np.ones((8, 4), np.float32)
    np.testing.assert_array_equal(simulate(scale_rows, x=x, bias=x, config=Config()), 2 * x)


def test_generation_follows_the_platform(simulate, request):
    want = {"trn2": 3, "trn3": 4}[request.config.getoption("--platform-target")]
    assert simulate(generation, x=np.zeros((1, 1), np.float32))[0, 0] == want
'''


def write_checkout(root):
    files = {
        "test/__init__.py": "",
        "test/conftest.py": CONFTEST,
        "test/integration/__init__.py": "",
        "test/integration/nkilib/__init__.py": "",
        "test/integration/nkilib/core/__init__.py": "",
        "test/integration/nkilib/core/demo/__init__.py": "",
        "test/integration/nkilib/core/demo/test_demo.py": TEST,
        "test/integration/nkilib/core/broken/__init__.py": "",
        "test/integration/nkilib/core/broken/test_broken.py": "import nki.isa as nisa\nnisa.not_an_instruction\n",
        "src/nkilib_src/__init__.py": "",
        "src/nkilib_src/nkilib/__init__.py": "",
        "src/nkilib_src/nkilib/core/__init__.py": "",
        "src/nkilib_src/nkilib/core/demo/__init__.py": "",
        "src/nkilib_src/nkilib/core/demo/kernel.py": KERNEL,
    }
    for path, text in files.items():
        p = root / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))


def test_per_family_counts_reasons_and_the_machine(tmp_path):
    checkout = tmp_path / "nki-library"
    write_checkout(checkout)
    report = tmp_path / "cases.json"
    r = subprocess.run([sys.executable, "-m", "torchneuron.nki.library", str(checkout), "--machine", "trn3",
                        "--json", str(report)], capture_output=True, text=True, timeout=600, cwd=str(tmp_path),
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT] + sys.path)})
    out = r.stdout
    assert r.returncode == 1, out + r.stderr  # a case failed
    section = out.split("== trn3:")[1]
    lines = {ln.split()[0]: ln.split()[1:] for ln in section.splitlines()[1:] if ln and not ln.startswith(" ")}
    assert lines["core/demo"] == ["4", "3", "1", "0"], section
    assert lines["core/broken"] == ["1", "0", "1", "0"], section
    assert lines["total"] == ["5", "3", "2", "0"], section
    assert "1 x AssertionError: Arrays are not equal" in section
    assert "has no attribute 'not_an_instruction'" in section
    cases = json.loads(report.read_text())
    outcomes = {k.split("::")[-1]: v["outcome"] for k, v in cases["trn3"].items()}
    assert outcomes["test_generation_follows_the_platform"] == "passed"  # NKI_NC_VERSION=gen4 reached the kernel
    assert outcomes["test_scale_rows_against_a_wrong_reference"] == "failed"


def test_not_a_checkout_is_refused(tmp_path, capsys):
    from torchneuron.nki import library
    with pytest.raises(SystemExit) as e:
        library.main([str(tmp_path)])
    assert e.value.code == 2 and "is not an nki-library checkout" in capsys.readouterr().err


def test_families_and_case_sizes():
    from torchneuron.nki import library
    assert library.family_of("integration/nkilib/core/moe/moe_cte/test_x.py::TestX::test_y[a]") == "core/moe/moe_cte"
    assert library.family_of("test/integration/nkilib/core/qkv/test_qkv.py::t") == "core/qkv"

    class Item:
        class callspec:
            params = {"b": 2, "s": (128, 4), "flag": True, "dtype": "bf16"}
    assert library.case_size(Item) == 2 * 128 * 4
