"""The command line: ``torchneuron-lockin`` and ``python -m torchneuron.lockin``.

    torchneuron-lockin [--fix | --diff] [--format table|json|sarif] [-o FILE] PATH...
    torchneuron-lockin --ci [--max-lines N] [--baseline REPORT.json] PATH...
    torchneuron-lockin run [--device neuron|cpu] [--program PATH] script.py|notebook.ipynb [ARGS...]

Exit status: 0; 1 when ``--ci`` fails (above the threshold or the baseline);
2 for a usage error; for ``run``, the program's own exit status.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .detect import analyse_file
from .report import RENDERERS, Report, ci_failures, headline
from .source import python_files


def analyse_paths(paths: list[str]) -> Report:
    files = python_files(paths)
    t0 = time.perf_counter()
    results = [analyse_file(p) for p in files]
    return Report(results, time.perf_counter() - t0)


def _write(text: str, output: str | None, stream=None) -> None:
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        (stream or sys.stdout).write(text)


def _render(report: Report, fmt: str, summary_only: bool) -> str:
    if fmt == "table":
        return RENDERERS["table"](report, list_findings=not summary_only)
    return RENDERERS[fmt](report)


def _output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=sorted(RENDERERS), default="table", help="report format (default: table)")
    p.add_argument("-o", "--output", help="write the report to this file")
    p.add_argument("--summary", action="store_true", help="table: the counts only, not every finding")


def analyse_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="torchneuron-lockin", description="Count, and fix, the lines that tie a "
                                "PyTorch program to CUDA. `torchneuron-lockin run --help` for the run mode.")
    p.add_argument("paths", nargs="+", metavar="PATH", help=".py files, .ipynb notebooks, folders")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--fix", action="store_true", help="rewrite every fixable finding in place")
    mode.add_argument("--diff", action="store_true", help="print the rewrite as a unified diff, change nothing")
    _output_options(p)
    p.add_argument("--ci", action="store_true", help="exit 1 above --max-lines or above --baseline")
    p.add_argument("--max-lines", type=int, default=None,
                   help="--ci: the most tying lines allowed (default 0 without --baseline)")
    p.add_argument("--baseline", help="--ci: a JSON report (--format json) no file may exceed")
    args = p.parse_args(argv)
    for path in args.paths:
        if not os.path.exists(path):
            p.error(f"no such file or folder: {path}")
    if args.fix or args.diff:
        return fix_main(args)
    report = analyse_paths(args.paths)
    _write(_render(report, args.format, args.summary), args.output)
    if args.ci:
        baseline = None
        if args.baseline:
            with open(args.baseline, encoding="utf-8") as f:
                baseline = json.load(f)
        max_lines = args.max_lines if args.max_lines is not None or baseline else 0
        failures = ci_failures(report, max_lines, baseline)
        for why in failures:
            print(f"torchneuron-lockin --ci: {why}", file=sys.stderr)
        return 1 if failures else 0
    return 0


def fix_main(args) -> int:
    from .fixer import fix_path, unified_diff

    files = python_files(args.paths)
    results, total, not_applied = [], 0, []
    for path in files:
        fix, result = fix_path(path, write=args.fix)
        results.append(result)
        total += fix.applied
        not_applied += [(path, s) for s in fix.not_applied]
        if args.diff and fix.changed:
            sys.stdout.write(unified_diff(fix))
    for path, spec in not_applied:
        print(f"torchneuron-lockin: not rewritten: {path}:{spec.span[0]}: {spec.kind}", file=sys.stderr)
    before = Report(results)
    if args.fix:
        after = analyse_paths(args.paths)
        print(f"before: {headline(before)}\nafter:  {headline(after)}", file=sys.stderr)
        if args.output:
            _write(_render(after, args.format, args.summary), args.output)
    else:
        print(f"{total} rewrites; {headline(before)}", file=sys.stderr)
    return 0


def run_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="torchneuron-lockin run", description="Run a program written for CUDA on "
                                "neuron, torch.cuda and \"cuda\" devices redirected, and report every line that "
                                "needed it with the static findings.")
    p.add_argument("--device", choices=("neuron", "cpu"), default="neuron",
                   help="where CUDA goes (cpu: the reference run of a machine without CUDA)")
    p.add_argument("--program", action="append", default=[], metavar="PATH",
                   help="more files or folders of the program (default: the script alone)")
    _output_options(p)
    p.add_argument("script", help="the program: a .py file or a notebook")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    args = p.parse_args(argv)
    from .running import run_program

    code, sites = run_program(args.script, args.args, args.device, [args.script, *args.program])
    report = analyse_paths([args.script, *args.program])
    report.merge_runtime(sites)
    _write(_render(report, args.format, args.summary), args.output, sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "run":
        return run_main(argv[1:])
    return analyse_main(argv)


if __name__ == "__main__":
    sys.exit(main())
