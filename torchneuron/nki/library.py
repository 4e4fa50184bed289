"""AWS's NKI Library test suite on this emulator: ``python -m torchneuron.nki.library /path/to/nki-library``.

The NKI Library (aws-neuron/nki-library) tests its kernels with pytest; its
``--test-mode simulation`` runs each kernel on the CPU through a simulator
package named ``nki_cpu_simulator`` and compares the outputs with the
library's own NumPy/torch references at each test's tolerance.  This runner
answers that package with torchneuron.nki (``cpu_simulator.py``) and runs the
checkout's suite unchanged, once per machine target, each in a fresh
interpreter:

* the checkout's ``src`` and root go on ``sys.path`` (the suite imports
  ``nkilib_src`` and ``test``), nothing of it is copied;
* ``neuron_dtypes`` (AWS's host dtype package) is answered by
  ``host_dtypes.py`` unless installed, and the harness's remote-execution and
  reporting packages by stand-ins unless installed (``library_stand_ins.py``);
  ``allpairspy`` (test-case generation) must be installed;
* pytest runs ``test/integration`` (or the paths given) with
  ``--test-mode simulation --platform-target <machine>``; the suite itself
  skips its large shapes in simulation mode;
* each test case has a time limit (``--timeout``) and the run an address-space limit
  (``--max-memory``), so that a case too large for the host fails alone.

It prints, per kernel family (a test directory under
``test/integration/nkilib``), the test cases run, passed, failed and skipped,
and the most frequent failure reasons, then the totals; ``--json FILE`` writes
every case's outcome.  Options after ``--`` go to pytest (``-k``, ``-m``, ...).
Exit status 0 when no test case failed.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from . import collectives, cpu_simulator, frontend, library_stand_ins
from .import_names import install_import_aliases
from .machine import set_machine

INTEGRATION = os.path.join("test", "integration")
FAMILY_ROOT = "integration/nkilib"
# harness modules the published checkout imports but does not contain (remote core locking, profile analysis)
UNPUBLISHED = ("test.utils.scripts.remote_lock_scripts", "test.utils.perf_analysis_private")


class CaseTimeout(BaseException):
    """A test case ran past the runner's time limit (not an Exception, so that the harness's
    ``except Exception`` around a kernel run does not swallow it)."""


class _XdistHooks:
    """The hook of pytest-xdist the suite's conftest implements, declared when xdist is not installed
    (the runner runs the cases in one process; pytest refuses unknown hooks)."""

    def pytest_configure_node(self, node):
        """A worker node is being configured (pytest-xdist)."""


class _Recorder:
    """pytest plugin: each test case's outcome and, for failures, a one-line reason."""

    def __init__(self, timeout, per_test=0, report_path=None, machine=None):
        self.timeout = timeout
        self.per_test = per_test
        self.report_path, self.machine = report_path, machine
        self.cases = {}

    def save(self, status=None):
        """Write the cases so far (after each one, so a long run can be read while it goes on)."""
        if self.report_path:
            tmp = self.report_path + ".part"
            with open(tmp, "w") as f:
                json.dump({"machine": self.machine, "status": status, "cases": self.cases}, f)
            os.replace(tmp, self.report_path)

    def pytest_runtest_logfinish(self, nodeid, location):
        self.save()

    @pytest.hookimpl(trylast=True)  # after the suite's own skips
    def pytest_collection_modifyitems(self, config, items):
        """With ``per_test``: keep each test function's smallest cases, after the suite's own skips."""
        if not self.per_test:
            return
        groups = collections.defaultdict(list)
        for item in items:
            if item.get_closest_marker("skip") is None:
                groups[(str(item.path), getattr(item, "originalname", item.name))].append(item)
        keep = set()
        for group in groups.values():
            group.sort(key=lambda it: (case_size(it), it.nodeid))
            keep.update(id(it) for it in group[:self.per_test])
        config.hook.pytest_deselected(items=[it for it in items if id(it) not in keep])
        items[:] = [it for it in items if id(it) in keep]

    def pytest_addhooks(self, pluginmanager):
        if not pluginmanager.has_plugin("xdist"):
            pluginmanager.add_hookspecs(type("XdistHookSpecs", (), {
                "pytest_configure_node": pytest.hookspec(_XdistHooks.pytest_configure_node)}))

    def pytest_sessionstart(self, session):
        # The published harness reads Orchestrator._compiled_kernel after every run, but only its
        # compile step (skipped in simulation mode) sets it: the class gets the default None.
        orchestrator = getattr(sys.modules.get("test.utils.test_orchestrator"), "Orchestrator", None)
        if orchestrator is not None and not hasattr(orchestrator, "_compiled_kernel"):
            orchestrator._compiled_kernel = None

    def pytest_runtest_call(self, item):
        if self.timeout and hasattr(signal, "SIGALRM"):
            def expire(signum, frame):
                raise CaseTimeout(f"test case ran past the runner's limit of {self.timeout} s")
            signal.signal(signal.SIGALRM, expire)
            signal.alarm(self.timeout)

    def pytest_runtest_logreport(self, report):
        if report.when == "call" and self.timeout and hasattr(signal, "SIGALRM"):
            signal.alarm(0)
        case = self.cases.setdefault(report.nodeid, {"outcome": "passed", "reason": "", "seconds": 0.0})
        case["seconds"] += report.duration
        if report.outcome == "failed" and case["outcome"] != "failed":
            case["outcome"] = "failed" if report.when == "call" else "error"
            case["reason"] = failure_reason(report)
        elif report.outcome == "skipped" and case["outcome"] == "passed":
            case["outcome"] = "skipped"
            longrepr = report.longrepr
            case["reason"] = str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)[:200]

    def pytest_collectreport(self, report):
        if report.outcome == "failed":
            self.cases[report.nodeid] = {"outcome": "error", "reason": failure_reason(report), "seconds": 0.0}


def case_size(item) -> int:
    """How large a test case is: the product of the positive integers among its parameters."""
    size = 1
    params = getattr(getattr(item, "callspec", None), "params", {})
    stack = list(params.values())
    while stack:
        v = stack.pop()
        if isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, int) and not isinstance(v, bool) and v > 1:
            size *= v
    return size


def failure_reason(report) -> str:
    """The last exception line of a failure (``Type: message``), shortened."""
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    errors = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    if crash is None and errors:  # a collection error: its traceback's last exception line
        return re.sub(r"0x[0-9a-f]+", "0x…", errors[-1])[:240]
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    line = lines[0] if lines else "?"
    if line.endswith(":") and len(lines) > 1:  # an exception whose message starts on the next line
        line = f"{line} {lines[1]}"
    line = re.sub(r"0x[0-9a-f]+", "0x…", line)
    return line[:240]


def family_of(nodeid: str) -> str:
    """The kernel family of a test case: its file's directory under test/integration/nkilib
    (node ids are relative to pytest's root directory, the checkout's ``test`` directory)."""
    path = nodeid.split("::")[0].replace("\\", "/")
    path = path.split(FAMILY_ROOT + "/", 1)[-1]
    return os.path.dirname(path) or path


def _enter_module_path(name, module):
    """Enter ``module`` as ``name`` with empty packages for its missing parents."""
    import types
    parts = name.split(".")
    for i in range(1, len(parts)):
        parent = ".".join(parts[:i])
        if parent not in sys.modules:
            package = types.ModuleType(parent)
            package.__path__ = []
            sys.modules[parent] = package
    sys.modules[name] = module
    for i in range(1, len(parts)):
        setattr(sys.modules[".".join(parts[:i])], parts[i], sys.modules[".".join(parts[:i + 1])])


def _prepare_imports(checkout):
    """The import names the suite needs: its own packages, the simulator, the host dtypes, stand-ins."""
    for path in (os.path.join(checkout, "src"), checkout):
        if path not in sys.path:
            sys.path.insert(0, path)
    # the stdlib's test package would shadow the checkout's
    for name in [m for m in sys.modules if m == "test" or m.startswith("test.")]:
        del sys.modules[name]
    cpu_simulator.install()
    # the harness's trace-only tests import the compiler front end under the name it is aliased to
    sys.modules.setdefault("nki.compiler.frontend", frontend)
    sys.modules.setdefault("nki.collectives", collectives)
    # a few modules still import the beta-1 names (``neuronxcc.nki.typing``, the compiler's host dtypes)
    install_import_aliases(torch_xla=False)
    try:
        import neuron_dtypes  # noqa: F401
    except ImportError:
        from . import host_dtypes  # the stand-in, imported only where the real package is missing
        sys.modules["neuron_dtypes"] = host_dtypes
    _enter_module_path("neuronxcc.starfish.support.dtype", sys.modules["neuron_dtypes"])
    library_stand_ins.install()
    for name in UNPUBLISHED:
        if not os.path.exists(os.path.join(checkout, *name.split(".")) + ".py"):
            parents = [name.rsplit(".", k)[0] for k in range(name.count(".") - 1, 0, -1)
                       if not os.path.isdir(os.path.join(checkout, *name.rsplit(".", k)[0].split(".")))]
            library_stand_ins.install_missing([*parents, name], f"{name} (not in the published checkout)")


def limit_memory(gib):
    """Cap this process's address space, so that a case whose inputs do not fit fails with a
    MemoryError instead of the whole run being killed by the system (the suite's largest shapes
    need tens of GiB on the host)."""
    import resource  # POSIX only
    limit = int(gib * 2 ** 30)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def run_suite(checkout, machine, pytest_args, timeout, report_path, per_test=0, max_memory_gib=None):
    """Run the suite in this process for one machine; write the cases to ``report_path``."""
    if max_memory_gib:
        limit_memory(max_memory_gib)
    checkout = os.path.abspath(checkout)
    # kernels the suite launches outside cpu_simulate (wrappers, the trace front end) run on it too
    set_machine(machine)
    _prepare_imports(checkout)
    recorder = _Recorder(timeout, per_test, report_path, machine)
    paths = [a for a in pytest_args if not a.startswith("-") and os.path.exists(os.path.join(checkout, a))]
    options = [a for a in pytest_args if a not in paths]
    with tempfile.TemporaryDirectory(prefix="nkilib-out-") as out:
        os.chdir(checkout)
        args = [*(paths or [INTEGRATION]), "--test-mode", "simulation", "--platform-target", machine,
                "--output-directory", out, "-p", "no:cacheprovider", "-q", "--no-header", "-rN",
                "--continue-on-collection-errors", *options]
        status = pytest.main(args, plugins=[recorder])
    recorder.save(int(status))
    return status


def summarize(cases: dict):
    """Per family: counts of each outcome and the failure reasons by frequency."""
    families = collections.defaultdict(lambda: {"run": 0, "passed": 0, "failed": 0, "skipped": 0,
                                                "reasons": collections.Counter()})
    for nodeid, case in cases.items():
        fam = families[family_of(nodeid)]
        if case["outcome"] == "skipped":
            fam["skipped"] += 1
            continue
        fam["run"] += 1
        if case["outcome"] == "passed":
            fam["passed"] += 1
        else:
            fam["failed"] += 1
            fam["reasons"][case["reason"]] += 1
    return dict(sorted(families.items()))


def print_summary(machine, cases, elapsed, reasons_per_family=3, out=sys.stdout):
    families = summarize(cases)
    print(f"== {machine}: NKI Library simulation suite on torchneuron.nki ({elapsed:.0f} s)", file=out)
    print(f"{'family':34} {'run':>5} {'pass':>5} {'fail':>5} {'skip':>5}", file=out)
    total = collections.Counter()
    for name, fam in families.items():
        print(f"{name:34} {fam['run']:5} {fam['passed']:5} {fam['failed']:5} {fam['skipped']:5}", file=out)
        for reason, n in fam["reasons"].most_common(reasons_per_family):
            print(f"    {n:4} x {reason}", file=out)
        total.update({k: fam[k] for k in ("run", "passed", "failed", "skipped")})
    print(f"{'total':34} {total['run']:5} {total['passed']:5} {total['failed']:5} {total['skipped']:5}", file=out)
    return total


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = []
    if "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(prog="python -m torchneuron.nki.library", description=__doc__.split("\n\n")[0])
    p.add_argument("checkout", help="a checkout of aws-neuron/nki-library")
    p.add_argument("--machine", action="append", choices=["trn2", "trn3"],
                   help="target (repeatable; default trn2 and trn3)")
    p.add_argument("--timeout", type=int, default=600, help="seconds per test case (default 600)")
    p.add_argument("--per-test", type=int, default=0, metavar="K",
                   help="run only the K smallest cases of each test function (default: every case)")
    p.add_argument("--max-memory", type=float, default=8.0, metavar="GIB",
                   help="address space per machine's run, in GiB (default 8; 0: no limit)")
    p.add_argument("--json", help="write every case's outcome, per machine, to this file")
    p.add_argument("--reasons", type=int, default=3, help="failure reasons listed per family")
    p.add_argument("--child-report", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    checkout = os.path.abspath(args.checkout)
    if not os.path.isdir(os.path.join(checkout, INTEGRATION)):
        p.error(f"{checkout} is not an nki-library checkout (no {INTEGRATION})")
    machines = args.machine or ["trn2", "trn3"]
    if args.child_report:
        status = run_suite(checkout, machines[0], pytest_args, args.timeout, args.child_report, args.per_test,
                           args.max_memory)
        return 0 if status in (0, 5) else 1
    results, failed = {}, 0
    for machine in machines:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            report = f.name
        started = time.perf_counter()
        cmd = [sys.executable, "-m", "torchneuron.nki.library", checkout, "--machine", machine,
               "--timeout", str(args.timeout), "--per-test", str(args.per_test), "--max-memory",
               str(args.max_memory), "--child-report", report,
               "--", *pytest_args]
        env = dict(os.environ, NEURON_LAUNCH_BLOCKING="1")
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            with open(report) as f:
                data = json.load(f)
        except (OSError, ValueError):
            print(proc.stdout[-4000:])
            print(f"== {machine}: the suite did not run (exit status {proc.returncode})")
            failed += 1
            continue
        finally:
            if os.path.exists(report):
                os.unlink(report)
        results[machine] = data["cases"]
        total = print_summary(machine, data["cases"], time.perf_counter() - started, args.reasons)
        failed += total["failed"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
