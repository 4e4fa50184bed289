"""Conformance with published NKI kernels: run a checkout's tutorial kernels through their own drivers.

    python -m torchneuron.nki.conformance /path/to/nki-samples [/path/to/another-checkout ...]

For every tutorial of ``src/nki_samples/tutorials`` in each checkout, every
NumPy and PyTorch driver script runs unchanged, in a fresh interpreter, on a
scratch copy of the tutorial's directory, with the upstream import names
installed (``install_import_aliases``: ``neuronxcc.nki``, ``nki``,
``torch_xla`` answered by the ``neuron`` device).  A kernel passes when every
driver run that calls it completes without an exception and without printing
a failed check ("differ", "matches? False", ...).  One line per kernel, then
the totals.  Nothing of the checkout is copied into this repository.

How drivers are run:

* A driver is a tutorial file with a ``__main__`` block or top-level code,
  or a ``*_torch.py``/``test_*.py`` file; JAX drivers are listed as skipped
  (JAX is not a framework the emulator integrates with).
* Some drivers take options; each variant in ``DRIVER_RUNS`` is a separate
  run (accuracy and perf modes, kernel versions).
* ``test_attention.py`` is a pytest-style file: its ``test_attn_tutorial``
  runs for every ``attn_fwd_v*`` kernel in its accuracy, benchmark and profile
  modes, with ``pytest`` in its namespace for its own ``xfail`` and the
  profile directory moved to the scratch copy.
* ``neuronxcc.nki.docs.examples.<tutorial>.<module>`` (the tutorials as
  packaged with the compiler) resolves to the checkout's file.
* Kernel launches block (``NEURON_LAUNCH_BLOCKING=1``) so an error names its
  call, and ``nki.benchmark`` times at most ``--benchmark-seconds`` of
  emulator iterations per call.

Exit status 0 when no kernel failed and no driver failed outside its kernels.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.abc
import importlib.util
import io
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import tempfile
import time

import torchneuron.nki as nki

from .bench import Benchmarked, _Profiled
from .jit import Kernel

TUTORIALS = os.path.join("src", "nki_samples", "tutorials")
FAIL_LINE = re.compile(r"\bdiffer\b|matches\?\s*False|pass\?\s*False|close\?\s*False|Accuracy check fails|"
                       r"not close|Test failed|verification failed", re.IGNORECASE)

# extra argument lists for drivers that have modes or versions (each list is one run)
DRIVER_RUNS = {
    "mamba_nki_kernels.py": [[], ["--mode", "perf"]],
    "layernorm_nki_kernel.py": [[], ["--mode", "perf"]],
    "layernorm_torch.py": [["--version", "v1"], ["--version", "v2"]],
    "sd_attention_nki_kernels.py": [[], ["--mode", "perf"]],
}
ATTENTION_DRIVER = "test_attention.py"
ATTENTION_MODES = ("accuracy", "benchmark", "profile")
KERNEL_DECORATORS = {"jit", "baremetal", "benchmark", "profile", "simulate"}


# --------------------------------------------------------------- discovery

def _decorator_name(node):
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def kernels_in(path):
    """Names of the functions decorated as NKI kernels in a source file."""
    try:
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
    except (SyntaxError, UnicodeDecodeError):
        return []
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef)
            and any(_decorator_name(d) in KERNEL_DECORATORS for d in n.decorator_list)]


def generation_of(path):
    text = open(path, encoding="utf-8").read()
    if re.search(r"^\s*(import|from)\s+neuronxcc", text, re.M):
        return "neuronxcc.nki"
    if re.search(r"^\s*(import|from)\s+nki\b", text, re.M):
        return "nki"
    return "-"


def _is_driver(path):
    name = os.path.basename(path)
    if name.endswith("_torch.py") or name.startswith("test_"):
        return True
    try:
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
    except (SyntaxError, UnicodeDecodeError):
        return False
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.dump(node.test):
            return True
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            return True
    return False


def discover(checkout):
    """{tutorial: {"dir", "kernels": {(file, name): generation}, "drivers": [(file, kind)], "skipped": [...]}}"""
    root = os.path.join(checkout, TUTORIALS)
    if not os.path.isdir(root):
        raise SystemExit(f"{checkout}: no {TUTORIALS} directory (point at an nki-samples checkout)")
    found = {}
    for tut in sorted(os.listdir(root)):
        d = os.path.join(root, tut)
        if not os.path.isdir(d):
            continue
        entry = {"dir": d, "kernels": {}, "drivers": [], "skipped": []}
        for f in sorted(os.listdir(d)):
            if not f.endswith(".py"):
                continue
            p = os.path.join(d, f)
            for k in kernels_in(p):
                entry["kernels"][(f, k)] = generation_of(p)
            if f.endswith("_jax.py"):
                entry["skipped"].append((f, "JAX driver (the emulator runs NumPy and PyTorch kernels)"))
            elif _is_driver(p):
                text = open(p, encoding="utf-8").read()
                kind = "torch" if re.search(r"^\s*(import torch\b|from torch\b)", text, re.M) else "numpy"
                entry["drivers"].append((f, kind))
        if entry["kernels"] or entry["drivers"]:
            found[tut] = entry
    return found


def describe_checkout(checkout):
    try:
        rev = subprocess.run(["git", "-C", checkout, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return rev or os.path.basename(os.path.abspath(checkout))


# ------------------------------------------------------------------- parent

def run_driver(tut_dir, driver, argv, *, timeout, machine, benchmark_seconds, extra_path):
    """Run one driver in a fresh interpreter on a scratch copy; returns its report (dict)."""
    work = tempfile.mkdtemp(prefix="nki-conformance-")
    try:
        wd = os.path.join(work, os.path.basename(tut_dir))
        shutil.copytree(tut_dir, wd)
        report_path = os.path.join(work, "report.json")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([wd] + extra_path + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["NEURON_LAUNCH_BLOCKING"] = "1"
        env["TORCHNEURON_NKI_BENCHMARK_SECONDS"] = str(benchmark_seconds)
        env["MPLBACKEND"] = "Agg"
        if machine:
            env["TORCHNEURON_MACHINE"] = machine
        cmd = [sys.executable, "-m", "torchneuron.nki.conformance", "--child", report_path,
               "--tutorials", os.path.dirname(tut_dir), "--", driver] + list(argv)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=wd, env=env, capture_output=True, text=True, timeout=timeout)
            out, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or "") + (e.stderr or "") if isinstance(e.stdout, str) else ""
            rc = None
        seconds = time.perf_counter() - t0
        try:
            with open(report_path) as f:
                report = json.load(f)
        except (OSError, ValueError):
            report = {"calls": [], "error": None}
        report.update(rc=rc, seconds=seconds, output=out[-4000:])
        if rc is None or (rc != 0 and not report.get("finished", False)):
            # the interpreter was stopped (timeout) or killed (a signal, e.g. out of memory)
            why = f"timed out after {timeout} s" if rc is None else (
                f"the driver's interpreter died (signal {-rc})" if rc < 0 else f"exit status {rc}")
            report["error"] = why
            calls = report.get("calls", [])
            if calls and calls[-1]["ok"]:
                calls[-1]["ok"], calls[-1]["detail"] = False, why
        elif rc != 0 and not report.get("error"):
            report["error"] = (out.strip().splitlines() or ["exit status %d" % rc])[-1]
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _short(text, n=160):
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 3] + "..."


def run_checkout(checkout, args, out=sys.stdout):
    found = discover(checkout)
    label = describe_checkout(checkout)
    print(f"== {checkout} ({label}), machine {args.machine or os.environ.get('TORCHNEURON_MACHINE') or 'trn2'}",
          file=out, flush=True)
    extra = [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]
    results = {}  # (tut, file, kernel) -> {"runs": [(driver desc, ok, detail)]}
    driver_errors = []
    skipped = []
    for tut, entry in found.items():
        if args.only and not any(re.search(args.only, s) for s in (tut,)):
            continue
        for f, why in entry["skipped"]:
            skipped.append((tut, f, why))
        for f, kind in entry["drivers"]:
            variants = [[]]
            if f == ATTENTION_DRIVER:
                variants = [["--attention", m] for m in ATTENTION_MODES]
            elif f in DRIVER_RUNS:
                variants = DRIVER_RUNS[f]
            for argv in variants:
                desc = f"{f} {' '.join(argv)}".strip()
                rep = run_driver(entry["dir"], f, argv, timeout=args.timeout, machine=args.machine,
                                 benchmark_seconds=args.benchmark_seconds, extra_path=extra)
                ran = set()
                for call in rep.get("calls", []):
                    key = (tut, call["file"], call["kernel"])
                    ran.add(key)
                    r = results.setdefault(key, {"runs": []})
                    r["runs"].append((f"{kind}:{desc}", call["ok"], call.get("detail", "")))
                if rep.get("error") and not any(not c["ok"] for c in rep.get("calls", [])):
                    driver_errors.append((tut, desc, rep["error"]))
                status = "ok" if not rep.get("error") and all(c["ok"] for c in rep.get("calls", [])) else "FAIL"
                if args.verbose:
                    print(f"   driver {tut}/{desc}: {status}, {len(ran)} kernels, {rep['seconds']:.1f} s",
                          file=out, flush=True)
    n_pass = n_fail = n_norun = 0
    for tut, entry in found.items():
        if args.only and not re.search(args.only, tut):
            continue
        for (f, k), gen in sorted(entry["kernels"].items()):
            r = results.get((tut, f, k))
            if r is None:
                failed = [(d, e) for t, d, e in driver_errors if t == tut]
                status = "NOT RUN"
                detail = (f"driver {failed[0][0]} failed before calling it: {_short(failed[0][1], 120)}"
                          if failed else "no driver of this checkout calls it")
                n_norun += 1
            else:
                bad = [(d, det) for d, ok, det in r["runs"] if not ok]
                drivers = sorted({d for d, _, _ in r["runs"]})
                if bad:
                    status, detail = "FAIL", f"{bad[0][0]}: {_short(bad[0][1])}"
                    n_fail += 1
                else:
                    status, detail = "PASS", "; ".join(drivers)
                    n_pass += 1
            print(f"  {status:<7} {tut}/{f}::{k}  [{gen}]  {detail}", file=out, flush=True)
    for tut, desc, err in driver_errors:
        missing = re.search(r"No module named '([\w.]+)'", err)
        kind = (f" (environment: the driver needs {missing.group(1)!r}, which is not installed)"
                if missing and not missing.group(1).split(".")[0] in ("nki", "neuronxcc", "torchneuron") else "")
        print(f"  DRIVER  {tut}/{desc}: {_short(err, 200)}{kind}", file=out, flush=True)
    for tut, f, why in skipped:
        print(f"  SKIP    {tut}/{f}: {why}", file=out, flush=True)
    total = n_pass + n_fail + n_norun
    print(f"  total {label}: {n_pass}/{total} kernels pass, {n_fail} fail, {n_norun} not run; "
          f"{len(driver_errors)} driver errors outside kernels, {len(skipped)} drivers skipped",
          file=out, flush=True)
    return n_pass, n_fail, n_norun, len(driver_errors)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m torchneuron.nki.conformance", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkouts", nargs="*", help="nki-samples checkouts (any commit)")
    p.add_argument("--machine", default=None, help="machine model for the drivers (TORCHNEURON_MACHINE)")
    p.add_argument("--only", default=None, help="regular expression on tutorial names")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per driver run")
    p.add_argument("--benchmark-seconds", type=float, default=2.0,
                   help="emulator time nki.benchmark may spend timing iterations per call")
    p.add_argument("--verbose", "-v", action="store_true", help="a line per driver run too")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--tutorials", default=None, help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    if args.child:
        # everything after "--" is the driver and its arguments
        return _child(args.child, args.tutorials, list(args.checkouts) + [a for a in rest if a != "--"])
    if not args.checkouts:
        p.error("give at least one nki-samples checkout")
    totals = [0, 0, 0, 0]
    for c in args.checkouts:
        for i, v in enumerate(run_checkout(c, args)):
            totals[i] += v
    if len(args.checkouts) > 1:
        print(f"== all checkouts: {totals[0]}/{sum(totals[:3])} kernels pass, {totals[1]} fail, "
              f"{totals[2]} not run, {totals[3]} driver errors")
    return 0 if totals[1] == 0 and totals[3] == 0 else 1


# -------------------------------------------------------------------- child

class _DocsExamples(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``neuronxcc.nki.docs.examples.<tutorial>.<module>``: the checkout's tutorial files."""

    PREFIX = "neuronxcc.nki.docs"

    def __init__(self, tutorials):
        self.tutorials = tutorials

    def find_spec(self, name, path=None, target=None):
        if name != self.PREFIX and not name.startswith(self.PREFIX + "."):
            return None
        parts = name.split(".")[3:]  # after neuronxcc.nki.docs
        if not parts or parts == ["examples"] or (len(parts) == 2 and parts[0] == "examples"):
            spec = importlib.util.spec_from_loader(name, self, is_package=True)
            spec.submodule_search_locations = []
            return spec
        if len(parts) == 3 and parts[0] == "examples":
            f = os.path.join(self.tutorials, parts[1], parts[2] + ".py")
            if os.path.exists(f):
                return importlib.util.spec_from_file_location(name, f)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []


class _Log:
    """What the child saw: kernel calls in order, and which failed.  Written to the report file at
    every change, so a driver that kills its interpreter still leaves its calls behind."""

    def __init__(self, path):
        self.path = path
        self.calls = []
        self.depth = 0
        self.error = None

    def save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"calls": self.calls, "error": self.error, "finished": self.error != "running"}, f)
        os.replace(tmp, self.path)

    def enter(self, fn, nested=False):
        code = getattr(fn, "__code__", None)
        f = os.path.basename(code.co_filename) if code is not None else "?"
        entry = {"file": f, "kernel": getattr(fn, "__name__", "?"), "ok": True}
        self.calls.append(entry)
        if not nested:
            self.top = entry
        self.save()
        return entry

    def fail_last(self, detail):
        """A failure seen outside a kernel (a printed check, an exception) belongs to the last kernel
        the driver called."""
        c = getattr(self, "top", None)
        if c is not None and c["ok"]:
            c["ok"], c["detail"] = False, detail
            self.save()


class _Tee(io.TextIOBase):
    def __init__(self, stream, log):
        self.stream, self.log, self.buf = stream, log, ""

    def write(self, s):
        self.stream.write(s)
        self.buf += s
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            if FAIL_LINE.search(line):
                self.log.fail_last(line.strip())
        return len(s)

    def flush(self):
        self.stream.flush()


def _instrument(log):
    def wrap(cls, attr, fn_of):
        original = getattr(cls, attr)

        def call(self, *a, **k):
            # a kernel called from a kernel (it runs inline) is recorded too, once per driver run
            nested = log.depth > 0
            fn = fn_of(self)
            if nested and any(c["kernel"] == fn.__name__ for c in log.calls):
                return original(self, *a, **k)
            entry = log.enter(fn, nested)
            log.depth += 1
            try:
                return original(self, *a, **k)
            except BaseException as e:
                if type(e).__name__ != "XFailed":
                    entry["ok"], entry["detail"] = False, f"{type(e).__name__}: {e}"
                else:
                    log.calls.remove(entry)
                    if getattr(log, "top", None) is entry:
                        log.top = None
                log.save()
                raise
            finally:
                log.depth -= 1
        setattr(cls, attr, call)
    wrap(Kernel, "__call__", lambda k: k.fn)
    wrap(Benchmarked, "__call__", lambda b: b.kernel.fn)
    wrap(_Profiled, "__call__", lambda p: p.kernel.fn)


def _child(report_path, tutorials, argv):
    nki.install_import_aliases()
    sys.meta_path.insert(0, _DocsExamples(tutorials))
    log = _Log(report_path)
    log.error = "running"
    log.save()
    _instrument(log)
    driver = argv[0]
    rest = argv[1:]
    error = None
    sys.stdout = _Tee(sys.stdout, log)
    try:
        if driver == ATTENTION_DRIVER and rest[:1] == ["--attention"]:
            _run_attention(rest[1], log)
        else:
            sys.argv = [driver] + rest
            runpy.run_path(driver, run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            error = f"SystemExit: {e.code}"
            log.fail_last(error)
    except BaseException as e:  # noqa: BLE001 (report whatever the driver raised)
        import traceback
        error = f"{type(e).__name__}: {e}"
        if log.calls:
            log.fail_last(error + " | " + traceback.format_exc().strip().splitlines()[-3].strip())
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stdout = sys.stdout.stream
        log.error = error
        log.save()
    return 1 if error else 0


def _run_attention(mode, log):
    """test_attention.py's test for every attention kernel in one mode."""
    sys.argv = [ATTENTION_DRIVER]
    try:
        import pytest
    except ImportError:
        pytest = None
    namespace = {}
    spec = importlib.util.spec_from_file_location("test_attention", os.path.abspath(ATTENTION_DRIVER))
    module = importlib.util.module_from_spec(spec)
    if pytest is not None:
        module.pytest = pytest
    sys.modules["test_attention"] = module
    spec.loader.exec_module(module)   # runs its own accuracy check of attn_fwd_v1 at import
    module.WORKING_DIRECTORY = os.path.join(os.getcwd(), "profiles")
    versions = sorted((n for n in dir(module) if re.fullmatch(r"attn_fwd_v\d+\w*", n)),
                      key=lambda n: (int(re.search(r"\d+", n).group()), n))
    for name in versions:
        with contextlib.suppress(Exception):
            namespace[name] = _attention_one(module, mode, getattr(module, name), log)


def _attention_one(module, mode, kernel, log):
    try:
        module.test_attn_tutorial(mode, kernel)
    except BaseException as e:  # noqa: BLE001
        if type(e).__name__ in ("XFailed", "Skipped"):
            return "xfail"
        log.fail_last(f"{type(e).__name__}: {e}")
        raise
    return "ok"


if __name__ == "__main__":
    sys.exit(main())
