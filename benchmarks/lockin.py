"""torchneuron-lockin's analysis speed: lines of Python analysed per second
over the installed source of transformers and accelerate (the smoke size: one
folder of each), target >= 10,000 lines/s.

The figure covers what the command's analysis does per file (read, the
prefilter, parse and the rules), not the interpreter's start-up; the best of
the repeats, as the machine is shared. Also reported: the rate over the
files that were parsed (the ones the prefilter let through), the counts of
findings, and that no file failed.

    .venv/bin/python benchmarks/lockin.py [--smoke]

A group in benchmarks/run.py's sense: ``STEPS``, ``run(cfg, bar)``, and
``targets(results)`` for the targets table.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LINES_PER_SECOND_MIN = 10_000
STEPS = 1


def source_roots(smoke: bool) -> list[str]:
    """The installed packages' folders (in smoke runs, one subfolder of each)."""
    import accelerate
    import transformers

    roots = [os.path.dirname(transformers.__file__), os.path.dirname(accelerate.__file__)]
    if smoke:
        roots = [os.path.join(roots[0], "models", "llama"), os.path.join(roots[0], "generation"),
                 os.path.join(roots[1], "utils")]
    return roots


def measure(roots: list[str], repeats: int) -> dict:
    from torchneuron.lockin.detect import analyse_file
    from torchneuron.lockin.report import Report
    from torchneuron.lockin.source import python_files

    files = python_files(roots)
    times, results = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        results = [analyse_file(p) for p in files]
        times.append(time.perf_counter() - t0)
    best = min(times)
    report = Report(results, best)
    s = report.summary()
    parsed_lines = sum(r.lines for r in results if r.parsed)
    return {"roots": roots, "files": s["files"], "files_parsed": s["files_parsed"], "lines": s["lines_analysed"],
            "lines_parsed": parsed_lines, "best_s": best, "times_s": times,
            "lines_per_second": s["lines_analysed"] / best, "parsed_lines_per_second": parsed_lines / best,
            "tying_lines": s["tying_lines"], "fixable_lines": s["fixable_lines"],
            "by_hand_lines": s["by_hand_lines"], "guarded_lines": s["guarded_lines"], "findings": s["findings"],
            "files_with_findings": s["files_with_findings"], "errors": s["errors"],
            "per_rule": {r["rule"]: r["lines"] for r in report.per_rule()}}


def run(cfg, bar) -> dict:
    out = {"analysis": measure(source_roots(cfg.smoke), cfg.pick(2, 1))}
    bar.update(1)
    return out


def targets(res: dict) -> list[dict]:
    r = res.get("lockin", {}).get("analysis")
    if r is None:
        return []
    return [{"group": "lockin", "name": "transformers + accelerate source",
             "figure": "lines of Python analysed per second", "value": r["lines_per_second"],
             "threshold": f">= {LINES_PER_SECOND_MIN:,}", "met": bool(r["lines_per_second"] >= LINES_PER_SECOND_MIN)}]


if __name__ == "__main__":
    from benchmarks.common import run_alone

    run_alone("lockin", run, targets, value_format=",.0f")
