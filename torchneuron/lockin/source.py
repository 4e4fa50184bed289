"""What the analyser reads: Python files and Jupyter notebooks, as Python text
with a map back to where each line came from.

A notebook is read as the JSON it is (nbformat's format 4, the cells'
``source`` a string or a list of lines), with the json module: nbformat's
own reader validates, which costs seconds of imports for nothing the analysis
needs.

A notebook's code cells are joined into one module, in document order, so
names imported in one cell resolve in the next; each cell starts with a marker
comment (:data:`CELL_MARKER`) that survives a rewrite, so the fixed text splits
back into the cells. IPython magics (``%time``, ``!pip``) are not Python: each
such line becomes a ``pass`` with a placeholder comment, restored after a
rewrite, and a cell magic (``%%bash``) makes the whole cell comments.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

CELL_MARKER = "# lockin-cell {index}"
_CELL_MARKER_RE = re.compile(r"^# lockin-cell (\d+)$")
_MAGIC_PLACEHOLDER = "pass  # lockin-magic {index}"
_MAGIC_PLACEHOLDER_RE = re.compile(r"^(\s*)pass  # lockin-magic (\d+)$")
_SKIPPED_DIRS = frozenset({".git", "__pycache__", ".venv", "venv", "node_modules", ".ipynb_checkpoints",
                           ".mypy_cache", ".pytest_cache", ".tox", "build", "dist"})


@dataclass
class Cell:
    index: int          # the cell's position among all the notebook's cells, from 1
    first_line: int     # its first source line in the joined text (after the marker)
    line_count: int


@dataclass
class Source:
    """One file to analyse: ``text`` is Python; for a notebook, the joined cells."""
    path: str
    text: str
    cells: list[Cell] | None = None                  # None: a .py file
    magics: list[str] = field(default_factory=list)  # the lines replaced by placeholders
    notebook: dict | None = None                     # the notebook's JSON, kept for writing back
    skipped_cells: list[int] = field(default_factory=list)  # cells that are not Python

    @property
    def is_notebook(self) -> bool:
        return self.cells is not None

    def location(self, line: int) -> tuple[int | None, int]:
        """(cell, line in the cell) of a line of ``text``; (None, line) for a .py file."""
        if self.cells is None:
            return None, line
        for cell in reversed(self.cells):
            if line >= cell.first_line:
                return cell.index, line - cell.first_line + 1
        return None, line


def read(path: str) -> Source:
    if path.endswith(".ipynb"):
        return read_notebook(path)
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        return Source(path, f.read())


def _is_magic(line: str) -> bool:
    stripped = line.lstrip()
    return stripped.startswith(("%", "!")) or (stripped.startswith("?") and not stripped.startswith("?="))


def cell_source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def read_notebook(path: str) -> Source:
    with open(path, encoding="utf-8") as f:
        notebook = json.load(f)
    parts, cells, magics, skipped = [], [], [], []
    line = 1
    for index, cell in enumerate(notebook.get("cells", []), start=1):
        if cell.get("cell_type") != "code":
            continue
        lines = cell_source(cell).split("\n")
        if lines and lines[0].lstrip().startswith("%%"):
            skipped.append(index)
            lines = ["# " + ln for ln in lines]
        else:
            converted = []
            for ln in lines:
                if _is_magic(ln):
                    indent = ln[:len(ln) - len(ln.lstrip())]
                    converted.append(indent + _MAGIC_PLACEHOLDER.format(index=len(magics)))
                    magics.append(ln)
                else:
                    converted.append(ln)
            lines = converted
        parts.append(CELL_MARKER.format(index=index))
        cells.append(Cell(index, line + 1, len(lines)))
        parts.extend(lines)
        line += 1 + len(lines)
    return Source(path, "\n".join(parts) + "\n", cells, magics, notebook, skipped)


def blank_cell(source: Source, index: int) -> None:
    """Turns one cell's lines into comments (a cell that does not parse), keeping line numbers."""
    lines = source.text.split("\n")
    for cell in source.cells:
        if cell.index == index:
            for i in range(cell.first_line - 1, cell.first_line - 1 + cell.line_count):
                lines[i] = "# " + lines[i]
    source.text = "\n".join(lines)
    source.skipped_cells.append(index)


def split_cells(source: Source, text: str) -> dict[int, str]:
    """The cells' sources from a (rewritten) joined text, magics restored."""
    out: dict[int, list[str]] = {}
    current = None
    lines = text.split("\n")
    if lines and lines[-1] == "":   # the joined text ends with a newline no cell has
        lines.pop()
    for ln in lines:
        m = _CELL_MARKER_RE.match(ln)
        if m:
            current = int(m.group(1))
            out[current] = []
            continue
        if current is None:
            if ln.strip():   # an import the fixer added above the first cell
                out.setdefault(0, []).append(ln)
            continue
        magic = _MAGIC_PLACEHOLDER_RE.match(ln)
        out[current].append(source.magics[int(magic.group(2))] if magic else ln)
    return {k: "\n".join(v) for k, v in out.items()}


def python_files(paths: list[str]) -> list[str]:
    """Every .py and .ipynb file under the given files and folders, sorted per folder,
    each once (``run --program .`` names the script's folder, which holds the script)."""
    found, seen = [], set()
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS and not d.endswith(".egg-info"))
                found.extend(os.path.join(root, f) for f in sorted(files) if f.endswith((".py", ".ipynb")))
        else:
            found.append(p)
    unique = []
    for f in found:
        key = os.path.realpath(f)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique
