"""The docs stay true: every relative link in README.md, docs/*.md and
tests/README.md names an existing path, and README.md's Layout table mentions
every source folder, so a folder added without documentation fails here."""
import glob
import os
import re
from urllib.parse import unquote

import pytest

from neuron_testing import ROOT

LINKED_DOCS = ["README.md", "tests/README.md"] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
SOURCE_ROOTS = ("csrc", "torchneuron")
SOURCE_SUFFIXES = (".cpp", ".h", ".py")
NOT_SOURCE_FOLDERS = {"tests", "__pycache__"}  # C++ unit tests and caches are not layout rooms

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)")
INLINE_LINK = re.compile(r"\]\(\s*(?:<([^>]*)>|([^)\s]*))(?:\s+[\"'(][^)]*)?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
HAS_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _read(relpath):
    with open(os.path.join(ROOT, relpath), encoding="utf-8") as f:
        return f.read()


def _prose_lines(text, keep_code_spans=False):
    """(line number, line) outside fenced code blocks, with inline code spans
    blanked unless kept."""
    in_fence = None
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            if in_fence is None:
                in_fence = fence.group(1)
            elif fence.group(1) == in_fence:
                in_fence = None
            continue
        if in_fence is None:
            yield number, line if keep_code_spans else CODE_SPAN.sub("code", line)


def _link_targets(lines):
    """(line number, target) of every inline and reference-style link."""
    for number, line in lines:
        targets = [bracketed or bare for bracketed, bare in INLINE_LINK.findall(line)]
        for target in targets + REFERENCE_LINK.findall(line):
            yield number, target


def _resolve(doc, target):
    """The repository path a relative link names, or None for URLs and anchors."""
    if not target or target.startswith("#") or HAS_SCHEME.match(target):
        return None
    path = unquote(target.split("#")[0].split("?")[0])
    base = ROOT if path.startswith("/") else os.path.dirname(os.path.join(ROOT, doc))
    return os.path.normpath(os.path.join(base, path.lstrip("/")))


@pytest.mark.parametrize("doc", LINKED_DOCS)
def test_relative_links_name_existing_paths(doc):
    assert os.path.exists(os.path.join(ROOT, doc)), f"{doc} is missing"
    broken = [f"{doc}:{number}: {target}" for number, target in _link_targets(_prose_lines(_read(doc)))
              if (path := _resolve(doc, target)) is not None and not os.path.exists(path)]
    assert not broken, "links to paths that do not exist:\n" + "\n".join(broken)


def _layout_rows():
    """The rows of the table under README.md's "Layout" heading."""
    rows, in_layout = [], False
    for number, line in _prose_lines(_read("README.md"), keep_code_spans=True):
        if re.match(r"^#{1,6}\s", line):
            in_layout = re.match(r"^#{1,6}\s+Layout\s*$", line) is not None
        elif in_layout and line.lstrip().startswith("|"):
            rows.append((number, line))
    return rows


def _source_folders():
    folders = []
    for top in SOURCE_ROOTS:
        for directory, subdirs, files in os.walk(os.path.join(ROOT, top)):
            subdirs[:] = sorted(d for d in subdirs if d not in NOT_SOURCE_FOLDERS and not d.startswith("."))
            if any(f.endswith(SOURCE_SUFFIXES) for f in files):
                folders.append(os.path.relpath(directory, ROOT).replace(os.sep, "/"))
    return folders


def _mentions(rows, folder):
    """True if a row links the folder or names its path (`csrc/bridge/ops/`, not
    a file in it or a folder below it)."""
    linked = {_resolve("README.md", target) for _, target in _link_targets(rows)}
    if os.path.normpath(os.path.join(ROOT, folder)) in linked:
        return True
    named = re.compile(r"(?<![\w/.-])" + re.escape(folder) + r"/?(?![\w/-])")
    return any(named.search(line) for _, line in rows)


def test_layout_table_lists_every_source_folder():
    rows = _layout_rows()
    assert rows, 'README.md has no table under a "Layout" heading'
    folders = _source_folders()
    assert folders, "no source folders found"
    missing = [folder for folder in folders if not _mentions(rows, folder)]
    assert not missing, "source folders missing from README.md's Layout table: " + ", ".join(missing)
