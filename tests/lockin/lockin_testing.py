"""Shared helpers of the lock-in tests: analyse or fix a snippet, read the corpus markers."""
from __future__ import annotations

import ast
import io
import json
import os
import re
import textwrap
import tokenize

from torchneuron.lockin import analyse_text
from torchneuron.lockin.fixer import fix_text

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
LABELLED = os.path.join(CORPUS, "labelled")
NEUTRAL = os.path.join(CORPUS, "neutral")
ROOT = os.path.dirname(os.path.dirname(HERE))

#: ``# ties: TNL001,TNL003`` at the end of every line that ties a corpus program to CUDA by naming
#: it; ``# ties-implicit: TNL028`` at the end of one that ties it without (a Triton kernel, say)
MARKER = re.compile(r"#\s*ties(-implicit)?:\s*([A-Z0-9, ]+)\s*$")


def analyse(code: str):
    return analyse_text(textwrap.dedent(code))


def found(code: str) -> list[tuple[int, str, bool]]:
    """(line, rule, fixable) of each finding that counts."""
    return [(f.line, f.rule, f.fixable) for f in analyse(code).findings if not f.guarded]


def fix(code: str) -> str:
    code = textwrap.dedent(code)
    result = analyse_text(code)
    out = fix_text(code, result)
    assert out.not_applied == [], out.not_applied
    ast.parse(out.fixed)
    return out.fixed


def corpus_files(folder: str) -> list[str]:
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith((".py", ".ipynb")))


def marked_lines(path: str) -> dict[tuple, set[str]]:
    """(cell, line) -> the rules its marker names; cell is None for a .py file."""
    return {where: rules for where, (rules, _) in labels(path).items()}


def labels(path: str) -> dict[tuple, tuple[set[str], bool]]:
    """(cell, line) -> (the rules its marker names, whether it is marked implicit)."""
    out = {}
    if path.endswith(".ipynb"):
        with open(path, encoding="utf-8") as f:
            notebook = json.load(f)
        for index, cell in enumerate(notebook["cells"], start=1):
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            for i, line in enumerate(source.split("\n"), start=1):
                m = MARKER.search(line)
                if m:
                    out[(index, i)] = ({r.strip() for r in m.group(2).split(",")}, bool(m.group(1)))
        return out
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            m = MARKER.search(line)
            if m:
                out[(None, i)] = ({r.strip() for r in m.group(2).split(",")}, bool(m.group(1)))
    return out


def comments(text: str) -> list[str]:
    return [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]


PATTERNS = os.path.join(CORPUS, "patterns")
SETTINGS_DIR = os.path.join(CORPUS, "settings")
SETTINGS = ("cpu", "neuron", "cuda")
_setting_runs: dict = {}


def setting_runs(base) -> tuple[dict, str]:
    """Every program of corpus/settings/ and corpus/patterns/, original and after --fix, run in
    the three settings of setting_runs.py: ({setting: {program: {"original"|"fixed": result}}},
    the folder of the fixed programs). Run once per test session, the three settings at once."""
    if _setting_runs:
        return _setting_runs["results"], _setting_runs["fixed"]
    import shutil
    import subprocess
    import sys

    from torchneuron.lockin import analyse_file
    from torchneuron.lockin.fixer import fix_path

    fixed = os.path.join(str(base), "fixed")
    os.makedirs(fixed)
    programs = corpus_files(SETTINGS_DIR) + corpus_files(PATTERNS)
    for p in programs:
        copy = os.path.join(fixed, os.path.basename(p))
        shutil.copy(p, copy)
        fix_result, _ = fix_path(copy, write=True)
        assert fix_result.not_applied == [] and fix_result.changed, p
        assert [f for f in analyse_file(copy).findings if f.fixable] == [], p
    procs = {}
    for setting in SETTINGS:
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + HERE}
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
            env.pop(k, None)
        if setting == "cpu":
            env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        out = os.path.join(str(base), f"{setting}.json")
        procs[setting] = (out, subprocess.Popen(
            [sys.executable, os.path.join(HERE, "setting_runs.py"), setting, out, fixed, *programs],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(base)))
    results = {}
    for setting, (out, proc) in procs.items():
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, (setting, stderr[-4000:])
        with open(out) as f:
            results[setting] = json.load(f)
    _setting_runs.update(results=results, fixed=fixed)
    return results, fixed


#: programs that compare a tensor's device type with the accelerator's: the CUDA stand-in
#: reports a CUDA accelerator but computes on the CPU, so there a fixed program's tensors
#: are not on "cuda" while the original's .is_cuda, redirected, says they are; and neither
#: redirection reaches a comparison of a string with "cuda" in the original. Where the
#: output cannot agree, only that the fixed program runs is checked.
DEVICE_TYPE_READERS = {"cuda": {"is_cuda.py", "device_type_compare.py", "jupyter_matmul.ipynb"},
                       "neuron": {"device_type_compare.py"}, "cpu": set()}


def check_run(runs, setting, name):
    """Where the original ran, the fixed program runs and prints the same."""
    original, fixed = runs[setting][name]["original"], runs[setting][name]["fixed"]
    if original["exit"] != 0:
        return False
    assert fixed["exit"] == 0, fixed["error"]
    if name not in DEVICE_TYPE_READERS[setting]:
        assert fixed["stdout"] == original["stdout"]
    return True
