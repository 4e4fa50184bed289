"""The differential ModuleInfo sweep (see sweep.py) as a test.

Writes tests/moduleinfo/REPORT.md (committed) and tests/moduleinfo/results.json
(raw, git-ignored), and fails if a module not listed in baseline.json's
`known_failures` has a failing sample, if the pass rate falls below
`min_pass_rate`, or if an operator outside `allowed_fallback_ops` needed the
synchronous fallback. Known failures that pass now are printed, so the list
can shrink.

MODULEINFO_MAX_SAMPLES overrides the per-(module, dtype, mode) sample cap
(0: every sample). MODULEINFO_REPORT_DIR writes the report elsewhere.
"""
import json
import os
import sys

import torchneuron.sanitizer

from . import sweep

HERE = os.path.dirname(os.path.abspath(__file__))


def test_moduleinfo_sweep():
    baseline = json.load(open(os.path.join(HERE, "baseline.json")))
    cap = int(os.environ.get("MODULEINFO_MAX_SAMPLES", baseline["max_samples"]))
    res = sweep.sweep(max_samples=cap, progress=True)
    out_dir = os.environ.get("MODULEINFO_REPORT_DIR", HERE)
    sweep.write_report(res, out_dir)
    line = sweep.summary_line(res)
    print(line)
    sys.stderr.write(line + "\n")
    known = baseline["known_failures"]
    failing = res.failing_modules()
    fixed = sorted(set(known) - set(failing))
    if fixed:
        sys.stderr.write(f"known failures that pass now (remove them from baseline.json): {fixed}\n")
    t = res.totals()
    assert t.passed + t.failed > 0.5 * baseline["samples_run"], "far fewer samples ran than the baseline's"
    new = {m: n for m, n in failing.items() if m not in known}
    first = {m: next(f["message"][:300] for f in res.failures if f["module"] == m) for m in new}
    assert not new, f"modules that pass in the baseline fail now (see {out_dir}/REPORT.md): {first}"
    assert res.pass_rate() >= baseline["min_pass_rate"], (
        f"pass rate {res.pass_rate():.4f} below baseline {baseline['min_pass_rate']}; see {out_dir}/REPORT.md")
    if baseline.get("allowed_fallback_ops") is not None:
        allowed = set(baseline["allowed_fallback_ops"])
        if torchneuron.sanitizer.active():  # its dispatch mode changes ATen's path (baseline.json's note)
            allowed |= set(baseline["allowed_fallback_ops_under_a_dispatch_mode"])
        extra = sorted(set(res.fallback_ops) - allowed)
        assert not extra, f"operators fell back to synchronous execution: {extra}"


def test_random_output_checks_reject_wrong_outputs():
    """check_random_output, which judges the random modules' training-mode
    outputs, passes the device's real output and rejects outputs that keep
    everything, drop the wrong fraction, use another dropped value or change
    a kept element."""
    import pytest
    import torch

    torch.manual_seed(sweep.SEED)
    x = torch.randn(32, 64)
    drop = torch.nn.Dropout(0.5).train()
    cpu_out = drop(x)
    dev_out = drop(x.to(sweep.DEVICE))
    assert "kept elements exact" in sweep.check_random_output(drop, x, cpu_out, dev_out)
    wrong_kept = dev_out.cpu().clone()
    wrong_kept[wrong_kept != 0] += 1e-3
    wrong_value = torch.where(dev_out.cpu() == 0, 1e-3, dev_out.cpu())
    for wrong in (x * 2, torch.nn.Dropout(0.1).train()(x), wrong_value, wrong_kept):
        with pytest.raises(sweep.Mismatch):
            sweep.check_random_output(drop, x, cpu_out, wrong)
    rrelu = torch.nn.RReLU(0.1, 0.2).train()
    assert "slopes" in sweep.check_random_output(rrelu, x, rrelu(x), rrelu(x.to(sweep.DEVICE)))
    for wrong in (torch.nn.functional.leaky_relu(x, 0.15), torch.nn.functional.leaky_relu(x, 0.3)):
        with pytest.raises(sweep.Mismatch):
            sweep.check_random_output(rrelu, x, rrelu(x), wrong)
