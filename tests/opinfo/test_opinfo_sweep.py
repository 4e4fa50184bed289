"""The differential OpInfo sweep (see sweep.py) as a test.

Writes tests/opinfo/REPORT.md (committed) and tests/opinfo/results.json (raw,
git-ignored), and fails if the pass rate falls below tests/opinfo/baseline.json,
or if any operator needed the synchronous fallback when the baseline says none
did.

OPINFO_MAX_SAMPLES overrides the per-(operator, dtype, direction) sample cap
(0: every sample; slow). OPINFO_REPORT_DIR writes the report elsewhere.
"""
import json
import os
import subprocess
import sys

import torchneuron.sanitizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# The sweep runs in an interpreter of its own: every OpInfo.sample_inputs call
# walks the Python stack with inspect.stack() (torch's TrackedInputIter), whose
# cost grows with sys.modules, and a whole suite's imports (transformers,
# accelerate, ...) made that most of the sweep's time.
CHILD = """
import json, os, sys
from tests.opinfo import sweep
res = sweep.sweep(max_samples=int(sys.argv[1]), progress=True)
sweep.write_report(res, sys.argv[2])
t = res.totals()
print(json.dumps({"line": sweep.summary_line(res), "run": t.passed + t.failed, "pass_rate": res.pass_rate(),
                  "fallback_ops": sorted(res.fallback_ops)}))
"""


def test_opinfo_sweep():
    baseline = json.load(open(os.path.join(HERE, "baseline.json")))
    cap = int(os.environ.get("OPINFO_MAX_SAMPLES", baseline["max_samples"]))
    out_dir = os.environ.get("OPINFO_REPORT_DIR", HERE)
    p = subprocess.run([sys.executable, "-c", CHILD, str(cap), out_dir], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                       timeout=3600)
    assert p.returncode == 0, p.stdout[-4000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    print(res["line"])
    sys.stderr.write(res["line"] + "\n")
    assert res["run"] > 0.5 * baseline["samples_run"], "far fewer samples ran than the baseline's"
    assert res["pass_rate"] >= baseline["min_pass_rate"], (
        f"pass rate {res['pass_rate']:.4f} below baseline {baseline['min_pass_rate']}; see {out_dir}/REPORT.md")
    if baseline.get("allowed_fallback_ops") is not None:
        allowed = set(baseline["allowed_fallback_ops"])
        if torchneuron.sanitizer.active():  # its dispatch mode changes ATen's path (baseline.json's note)
            allowed |= set(baseline["allowed_fallback_ops_under_a_dispatch_mode"])
        new = sorted(set(res["fallback_ops"]) - allowed)
        assert not new, f"operators fell back to synchronous execution: {new}"
