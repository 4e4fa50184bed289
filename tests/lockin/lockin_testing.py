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

#: ``# ties: TNL001,TNL003`` at the end of every line that ties a corpus program to CUDA
MARKER = re.compile(r"#\s*ties:\s*([A-Z0-9, ]+)\s*$")


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
                    out[(index, i)] = {r.strip() for r in m.group(1).split(",")}
        return out
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            m = MARKER.search(line)
            if m:
                out[(None, i)] = {r.strip() for r in m.group(1).split(",")}
    return out


def comments(text: str) -> list[str]:
    return [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
