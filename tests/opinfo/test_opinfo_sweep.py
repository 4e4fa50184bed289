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
import sys

import pytest

from . import sweep

HERE = os.path.dirname(os.path.abspath(__file__))


def test_opinfo_sweep():
    baseline = json.load(open(os.path.join(HERE, "baseline.json")))
    cap = int(os.environ.get("OPINFO_MAX_SAMPLES", baseline["max_samples"]))
    res = sweep.sweep(max_samples=cap, progress=True)
    out_dir = os.environ.get("OPINFO_REPORT_DIR", HERE)
    sweep.write_report(res, out_dir)
    line = sweep.summary_line(res)
    print(line)
    sys.stderr.write(line + "\n")
    t = res.totals()
    assert t.passed + t.failed > 0.5 * baseline["samples_run"], "far fewer samples ran than the baseline's"
    assert res.pass_rate() >= baseline["min_pass_rate"], (
        f"pass rate {res.pass_rate():.4f} below baseline {baseline['min_pass_rate']}; see {out_dir}/REPORT.md")
    if baseline.get("allowed_fallback_ops") is not None:
        new = sorted(set(res.fallback_ops) - set(baseline["allowed_fallback_ops"]))
        assert not new, f"operators fell back to synchronous execution: {new}"
