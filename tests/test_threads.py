"""Host threads working on one device at once: every result equals the CPU's, on one shared stream
and on a stream each, for warm signatures and for first calls made at the same moment
(thread_workloads.py says what each kind does). On CUDA, threads sharing a stream are correct
because all device work is stream-ordered; here every host write into device memory is ordered
on its stream too (exec/launch.h, write_from_host).

Each configuration runs in a fresh interpreter (first calls need one). CI checks
TORCHNEURON_THREAD_RESULTS results per warm configuration (default below); the long run
(10,000 and more) is the command in thread_workloads.py.
"""
import json
import os
import sys

import pytest

from neuron_testing import ROOT, run_python

RESULTS = int(os.environ.get("TORCHNEURON_THREAD_RESULTS", "2000"))


def workload(threads: int, streams: str, kinds: dict, env: dict | None = None) -> list:
    """Runs each kind of work (first calls first: they need new signatures) for its results, in one
    child; its figures per kind."""
    code = f"""
        import json, sys
        sys.path.insert(0, "tests")
        import torchneuron.memcheck, torchneuron.sanitizer
        from thread_workloads import run
        for kind, results in {kinds!r}.items():
            out = run({threads}, {streams!r}, kind, results)
            out["memcheck reports"] = len(torchneuron.memcheck.reports()) if torchneuron.memcheck.enabled() else None
            san = torchneuron.sanitizer.active()
            out["sanitizer reports"] = len(san.reports) if san else None
            print(json.dumps(out))
    """
    p = run_python(code, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return [json.loads(line) for line in p.stdout.strip().splitlines()[-len(kinds):]]


@pytest.mark.parametrize("threads", [2, 4, 8])
@pytest.mark.parametrize("streams", ["shared", "own"])
def test_every_result_is_the_cpus(threads, streams):
    first, warm = workload(threads, streams, {"first": 10 ** 6, "warm": RESULTS})
    assert first["checked"] >= 1000 * threads and warm["checked"] >= RESULTS - threads, (first, warm)
    for out in (first, warm):
        assert not out["errors"], out["errors"]
        assert out["wrong"] == 0, f"{out['kind']}: {out['wrong']} of {out['checked']} results wrong: {out['examples']}"


@pytest.mark.parametrize("checker", ["TORCHNEURON_MEMCHECK", "TORCHNEURON_STREAM_SANITIZER"])
def test_checkers_find_nothing_in_correct_threads(checker):
    """The memory checker and the stream sanitizer (which watches every thread started while it is
    on) report nothing on these correct programs; each child exits cleanly."""
    for out in workload(4, "shared", {"first": 600, "warm": 600}, env={checker: "1"}):
        assert out["wrong"] == 0 and not out["errors"], out
        reports = out["memcheck reports" if checker == "TORCHNEURON_MEMCHECK" else "sanitizer reports"]
        assert reports == 0, out


def test_workload_command_prints_its_figures():
    """The long run's command line (thread_workloads.py) works as documented."""
    import subprocess

    p = subprocess.run([sys.executable, "tests/thread_workloads.py", "--threads", "2", "--results", "100"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["checked"] == 100 and out["wrong"] == 0
