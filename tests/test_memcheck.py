"""The device memory checker (TORCHNEURON_MEMCHECK, docs/sanitizers.md): seeded
bugs each caught with the right report, correct programs with none. Each case
runs in a child process, since the checker is switched on at load and a host
access faults."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PRELUDE = """
import ctypes, json, sys, warnings
import numpy as np
import torch, torchneuron
import torchneuron.memcheck as mc
if not mc.protecting() and NEEDS_PROTECTION:
    print(json.dumps({"skip": "host access protection is off: " + torchneuron._C._memcheck_protection_off_reason()}))
    sys.exit(0)
caught = []
def done(**extra):
    torch.neuron.synchronize()
    sum(range(10))  # a few bytecodes: the pending report is delivered between them
    print(json.dumps({"reports": [[r.kind, str(r)] for r in mc.reports()], "stats": mc.stats(), **extra}))
"""


def run_child(body: str, needs_protection: bool = False, mode: str = "warn", tmp_path=None) -> dict:
    import tempfile
    code = PRELUDE.replace("NEEDS_PROTECTION", str(needs_protection)) + textwrap.dedent(body)
    with tempfile.NamedTemporaryFile("w", suffix="_memcheck_case.py", delete=False) as f:
        f.write(code)  # a file, so that reports show source lines
    env = dict(os.environ, TORCHNEURON_MEMCHECK=mode, PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    try:
        p = subprocess.run([sys.executable, f.name], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    finally:
        os.unlink(f.name)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    if "skip" in out:
        pytest.skip(out["skip"])
    return out


def kinds(out: dict) -> list[str]:
    return [k for k, _ in out["reports"]]


def test_host_read_through_raw_pointer_raises_naming_the_block_and_the_line():
    out = run_child("""
        x = torch.arange(1000., device="neuron")
        torch.neuron.synchronize()
        try:
            value = ctypes.c_float.from_address(x.data_ptr() + 8).value
            sum(range(10))
        except mc.MemcheckError as e:
            caught.append(str(e))
        done(caught=caught, value=value)
    """, needs_protection=True, mode="1")
    assert len(out["caught"]) == 1, out
    msg = out["caught"][0]
    assert "host access: host code read device memory" in msg
    assert "byte 8 of the block" in msg and "4000 bytes requested" in msg
    assert "_ctypes" in msg                                   # the faulting instruction's library
    # the Python code running when it is delivered: the access's line or the next
    assert "value = ctypes.c_float.from_address" in msg or "sum(range(10))" in msg, msg
    assert "The block was allocated at" in msg
    assert out["value"] == 2.0                                # the access completed: no crash


def test_host_read_through_numpy_of_an_alias_is_reported():
    out = run_child("""
        x = torch.ones(4096, device="neuron")
        torch.neuron.synchronize()
        alias = torch.from_numpy(np.ctypeslib.as_array(ctypes.cast(x.data_ptr(), ctypes.POINTER(ctypes.c_float)),
                                                       shape=(4096,)))
        total = float(alias.numpy().sum())
        done(total=total)
    """, needs_protection=True)
    assert kinds(out) == ["host access"], out
    assert "16384 bytes requested" in out["reports"][0][1] and "total = float(alias.numpy().sum())" in out["reports"][0][1]
    assert out["total"] == 4096.0


def test_write_after_free_is_found_when_the_memory_is_handed_out_again():
    out = run_child("""
        x = torch.ones(1024, device="neuron")
        ptr = x.data_ptr()
        torch.neuron.synchronize()
        del x
        ctypes.c_float.from_address(ptr + 40).value = 7.0   # after the free
        y = torch.empty(1024, device="neuron")              # the same block again
        done(same=y.data_ptr() == ptr)
    """)
    assert out["same"], out
    assert kinds(out) == ["host access", "write after free"], out
    waf = out["reports"][1][1]
    assert "byte 0x" in waf and "holds 0x00 instead of the poison 0xfb" in waf  # 7.0f's low byte
    assert "That block was allocated at" in waf and "x = torch.ones(1024" in waf
    assert "and freed at" in waf and "del x" in waf


def test_out_of_bounds_write_by_a_device_task_names_the_kernel():
    # The NKI emulator bounds-checks every access a kernel makes
    # (NKIOutOfBoundsError), so an NKI kernel cannot overrun; this seeds the
    # overrun in the task machinery NKI kernels run on (torchneuron/_python_tasks.py).
    out = run_child("""
        from torchneuron._python_tasks import launch
        y = torch.zeros(100, device="neuron")
        def overrun(hosts):
            h = hosts[0]
            np.ctypeslib.as_array((ctypes.c_float * 104).from_address(h.data_ptr()))[:] = 1.0
        launch("nki::overrun", [y], overrun)
        done(head=y[:100].sum().item())
    """)
    assert kinds(out) == ["out of bounds"], out
    msg = out["reports"][0][1]
    assert "task nki::overrun on neuron:0 stream 0 wrote past the end" in msg and "400 bytes requested" in msg
    assert "byte 400 of the block (0 past the requested bytes)" in msg
    assert out["head"] == 100.0


def test_out_of_bounds_write_by_an_extension_kernel_names_it(tmp_path):
    # A C++ kernel registered for PrivateUse1 that runs as a device task
    # (the launcher compiled kernels use), built with the system compiler.
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    src = tmp_path / "overrun.cpp"
    src.write_text('#include <cstdint>\nextern "C" void overrun_fill(float* p, int64_t n) '
                   '{ for (int64_t i = 0; i <= n; ++i) p[i] = 2.0f; }\n')
    lib = tmp_path / "liboverrun.so"
    subprocess.run([cxx, "-O1", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True, timeout=60)
    out = run_child(f"""
        fn = ctypes.cast(ctypes.CDLL({str(lib)!r}).overrun_fill, ctypes.c_void_p).value
        lib = torch.library.Library("memcheck_ext", "DEF")
        lib.define("fill(Tensor(a!) t) -> ()")
        def fill(t):
            torchneuron._C._launch_cpp_kernel(fn, "memcheck_ext::fill", t.device.index, [t.data_ptr(), t.numel()], [], [])
        lib.impl("fill", fill, "PrivateUse1")
        t = torch.zeros(64, device="neuron")
        torch.ops.memcheck_ext.fill(t)
        done(total=t.sum().item())
    """)
    assert kinds(out) == ["out of bounds"], out
    assert "task memcheck_ext::fill" in out["reports"][0][1] and "256 bytes requested" in out["reports"][0][1]
    assert out["total"] == 128.0


MISSING_RECORD_STREAM = """
    s1 = torch.neuron.Stream()
    a = torch.randn(768, 768, device="neuron")
    x = torch.ones(1 << 16, device="neuron")
    torch.neuron.synchronize()
    with torch.neuron.stream(s1):
        for _ in range(6):
            a = a @ a / 768      # keeps s1 busy
        y = x.view(256, 256) @ x.view(256, 256)   # queued on s1 behind it
    RECORD
    del x                        # freed on the default stream's pool
    z = torch.full((1 << 16,), 5.0, device="neuron")   # handed out again at once
    done(reused=True)
"""


def test_missing_record_stream_reports_the_use_and_the_reuse():
    out = run_child(MISSING_RECORD_STREAM.replace("RECORD", ""))
    assert kinds(out) == ["missing record_stream"], out
    msg = out["reports"][0][1]
    assert "task aten::mm on neuron:0 stream" in msg and "record_stream" in msg, msg
    assert "del x" in msg, msg


def test_correct_programs_report_nothing():
    out = run_child(MISSING_RECORD_STREAM.replace("RECORD", "x.record_stream(s1)").replace(
        "done(reused=True)", "") + """
    # a small training loop, eager and fused, with host reads of results
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(5):
        xb = torch.randn(16, 32, device="neuron")
        loss = model(xb).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
    host = model[0].weight.detach().cpu().numpy()
    ev = torch.neuron.Event()
    with torch.neuron.stream(s1):
        w = model[0].weight.detach() * 3
        ev.record()
    torch.neuron.current_stream().wait_event(ev)
    w.add_(1)
    done(finite=bool(np.isfinite(host).all()))
    """, mode="1")
    assert out["reports"] == [], out
    assert out["finite"]
    assert out["stats"]["checked"] > 0 and out["stats"]["poisoned"] > 0 and out["stats"]["canary_checks"] > 0
