"""PyTorch's own device-generic test files on `cpu` and `neuron` (runner.py).

Fails on a test that passes on the CPU and fails on `neuron` unless
lists.KNOWN_DEFECTS names it, on a known defect that no longer fails, on a
list entry that names no test, and on a file that could not run. Writes
tests/upstream/REPORT.md. CI runs the fixed sample; TORCHNEURON_UPSTREAM=full
runs every test of every file (long: see REPORT.md for a full run's time).
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_upstream_files_on_neuron(tmp_path):
    sys.path.insert(0, ROOT)
    from tests.upstream import runner
    out = tmp_path / "results.json"
    report = os.environ.get("TORCHNEURON_UPSTREAM_REPORT", os.path.join(HERE, "REPORT.md"))
    # Its own interpreter: each test file runs in worker processes anyway, and the
    # suite's own imports and device state stay out of them.
    p = subprocess.run([sys.executable, "-m", "tests.upstream.runner", "--report", report, "--json", str(out)],
                       cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=4 * 3600 if runner.mode() == "full" else 1800)
    sys.stderr.write(p.stdout[-3000:])
    res = json.load(open(out))
    ran = sum(len(f["results"]) for f in res["files"].values())
    assert ran > 0.5 * sum(runner.SAMPLE.values()), f"only {ran} tests ran:\n{p.stdout[-3000:]}"
    problems = [ln for ln in p.stdout.splitlines() if ln.startswith("PROBLEM:")]
    assert p.returncode == 0 and not problems, "\n".join(problems) or p.stdout[-3000:]
