"""Runs small CUDA programs and their ``--fix`` rewrites, in this one process,
in one of three settings (test_lockin_settings.py starts one process per setting):

* ``cpu``: a machine without an accelerator. Started with
  TORCH_DEVICE_BACKEND_AUTOLOAD=0 and never importing torchneuron, so
  ``torch.accelerator`` has no device and ``torch.cuda`` none either (CPU build);
  both programs run as they are.
* ``neuron``: the fixed program as it is (the accelerator is ``neuron``); the
  original under ``torchneuron-lockin run`` (CUDA redirected to ``neuron``).
* ``cuda``: a stand-in for a CUDA machine, computing on the CPU. The original
  runs under redirect.py's Redirection to the CPU, where ``torch.cuda``
  reports a device (the run mode's reference); the fixed program runs under
  the same Redirection with ``torch.accelerator`` (and
  ``torch.get_device_module()``) reporting that device as ``cuda``, so its
  ``"cuda"`` devices reach the same redirection.

    python setting_runs.py SETTING OUT.json FIXED_DIR PROGRAM...

A notebook runs as its code cells in order, IPython's magics left out (the
CPU-only setting cannot import torchneuron.lockin's notebook reader: it would
load the backend). Global settings a program changes (matmul precision, cuDNN
flags) are put back before each run.

OUT.json: {program: {"original"|"fixed": {"exit": 0|1, "stdout": ..., "error": ...}}}.
"""
import contextlib
import io
import json
import linecache
import os
import runpy
import sys
import time
import traceback
import warnings

import torch

warnings.simplefilter("ignore")


_FLAGS = (torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
          torch.backends.cudnn.allow_tf32)


def _reset() -> None:
    torch.set_float32_matmul_precision(_FLAGS[0])
    (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
     torch.backends.cudnn.allow_tf32) = _FLAGS[1:]


def _notebook_code(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        cells = [c for c in json.load(f)["cells"] if c["cell_type"] == "code"]
    lines = []
    for c in cells:
        source = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        if not source.startswith("%%"):
            lines += [ln for ln in source.split("\n") if not ln.lstrip().startswith(("!", "%"))]
    return "\n".join(lines) + "\n"


def _run_notebook(path: str) -> None:
    code = _notebook_code(path)
    filename = os.path.abspath(path)
    linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
    exec(compile(code, filename, "exec"), {"__name__": "__main__", "__file__": filename})


def _run(path: str) -> dict:
    out = io.StringIO()
    error = None
    _reset()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out):
            if path.endswith(".ipynb"):
                _run_notebook(path)
            else:
                runpy.run_path(path, run_name="__main__")
    except BaseException:   # the program's failure is the finding
        error = traceback.format_exc(limit=-3)
    return {"exit": 0 if error is None else 1, "stdout": out.getvalue(), "error": error,
            "seconds": round(time.perf_counter() - t0, 3)}


#: made before any redirection, which would turn it into the CPU device it redirects to
CUDA = torch.device("cuda")


@contextlib.contextmanager
def _accelerator_is_cuda(redirection):
    """torch.accelerator as on a machine with one CUDA device: the device module is
    the redirection's torch.cuda, which program code sees as the CPU stand-in."""
    cuda = CUDA
    module = sys.modules["torch.cuda"]   # the proxy, inside the redirection
    stand_in = object.__getattribute__(module, "_redirected")
    patches = {
        "current_accelerator": lambda check_available=False: cuda, "is_available": lambda: True,
        "device_count": lambda: 1, "current_device_index": lambda: 0, "set_device_index": lambda i: None,
        "synchronize": lambda device=None: None, "empty_cache": lambda: None,
        **{name: (lambda device=None: 0) for name in ("memory_allocated", "max_memory_allocated",
                                                       "memory_reserved", "max_memory_reserved")},
        "memory_stats": lambda device=None: {}, "reset_peak_memory_stats": lambda device=None: None,
    }
    saved = {name: getattr(torch.accelerator, name) for name in patches}
    saved_module = torch.get_device_module
    try:
        for name, fn in patches.items():
            setattr(torch.accelerator, name, fn)
        torch.get_device_module = lambda device=None: stand_in
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.accelerator, name, fn)
        torch.get_device_module = saved_module


def main(setting: str, out_path: str, fixed_dir: str, programs: list[str]) -> None:
    results = {}
    if setting == "cpu":
        assert "torchneuron" not in sys.modules and torch.accelerator.current_accelerator() is None
    for program in programs:
        name = os.path.basename(program)
        fixed = os.path.join(fixed_dir, name)
        if setting == "cpu":
            results[name] = {"original": _run(program), "fixed": _run(fixed)}
        elif setting == "neuron":
            from torchneuron.lockin.redirect import Redirection
            with Redirection("neuron", [program]):
                original = _run(program)
            results[name] = {"original": original, "fixed": _run(fixed)}
        else:
            from torchneuron.lockin.redirect import Redirection
            with Redirection("cpu", [program]):
                original = _run(program)
            with Redirection("cpu", [fixed]) as r, _accelerator_is_cuda(r):
                fixed_result = _run(fixed)
            results[name] = {"original": original, "fixed": fixed_result}
    if setting == "cpu":
        assert "torchneuron" not in sys.modules, "the CPU-only setting imported torchneuron"
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
