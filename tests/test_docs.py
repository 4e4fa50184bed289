"""The docs stay true: every relative link in README.md, docs/*.md and
tests/README.md names an existing path; README.md's Layout table mentions
every source folder; and each layout table (LAYOUT_TABLES) names only files
that exist and every source file of the folders it lists, so a file added,
renamed or removed without its table fails here."""
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


def _table_rows(doc="README.md", heading="Layout"):
    """The rows of the table under ``doc``'s ``heading``."""
    rows, in_layout = [], False
    for number, line in _prose_lines(_read(doc), keep_code_spans=True):
        if re.match(r"^#{1,6}\s", line):
            in_layout = re.match(r"^#{1,6}\s+" + re.escape(heading) + r"\s*$", line) is not None
        elif in_layout and line.lstrip().startswith("|"):
            rows.append((number, line))
    return rows


def _layout_rows():
    return _table_rows("README.md", "Layout")


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


# Layout tables: (document, heading, folder). With a folder, the table lists that folder's
# files by bare name in its first column; without, each row's first cell links its folder
# and the row names that folder's files.
LAYOUT_TABLES = (("README.md", "Layout", None), ("docs/nki.md", "Layout of the code", "torchneuron/nki"),
                 ("docs/nki.md", "Layout of the lowering", "torchneuron/nki/lower"))
# README.md's row summarises these folders; their own table names every file
LISTED_ELSEWHERE = {"torchneuron/nki": "docs/nki.md", "torchneuron/nki/lower": "docs/nki.md"}
LISTED_ROOTS = SOURCE_ROOTS + ("torch_neuronx",)
# a package's __init__.py and __main__.py are the folder itself and its command
NOT_LISTED_FILES = {"__init__.py", "__main__.py"}
FIRST_CELL = re.compile(r"^\s*\|\s*([^|]*)\|")
BRACES = re.compile(r"\{([^{}]*)\}")


def _expand(name):
    """``nki_host.{h,cpp}`` -> nki_host.h, nki_host.cpp."""
    m = BRACES.search(name)
    if not m:
        return [name]
    return [x for part in m.group(1).split(",") for x in _expand(name[:m.start()] + part.strip() + name[m.end():])]


def _row_folder(doc, line):
    """The folder a README.md row is about (its first cell's link), or None."""
    for target in [b or t for b, t in INLINE_LINK.findall(FIRST_CELL.match(line).group(1))]:
        path = _resolve(doc, target)
        if path is not None and os.path.isdir(path):
            return os.path.relpath(path, ROOT).replace(os.sep, "/")
    return None


def _named_paths(doc, line, folder):
    """Repository paths a row names: its links, and the file names in its first cell's
    code spans (relative to ``folder``, or to the repository when they hold a slash)."""
    paths = {p for _, t in _link_targets([(0, line)]) if (p := _resolve(doc, t)) is not None}
    if folder is not None:
        for span in re.findall(r"`([^`]+)`", FIRST_CELL.match(line).group(1)):
            for name in _expand(span.strip()):
                paths.add(os.path.normpath(os.path.join(ROOT, name if "/" in name else f"{folder}/{name}")))
    return paths


def _tables():
    """(document, line number, line, folder) of every layout-table row that names a folder."""
    for doc, heading, folder in LAYOUT_TABLES:
        rows = _table_rows(doc, heading)
        assert rows, f'{doc} has no table under a "{heading}" heading'
        for number, line in rows:
            if FIRST_CELL.match(line) and not re.match(r"^\s*\|[\s:-]*\|", line):
                yield doc, number, line, folder if folder is not None else _row_folder(doc, line)


def test_layout_tables_name_existing_files():
    missing = [f"{doc}:{number}: {os.path.relpath(path, ROOT)}" for doc, number, line, folder in _tables()
               for path in sorted(_named_paths(doc, line, folder)) if not os.path.exists(path)]
    assert not missing, "layout tables name files that do not exist:\n" + "\n".join(missing)


def _is_named(name, folder, paths, text):
    """A file is named by its path, by its bare name, or through its header or source twin
    (``x.h`` names ``x.cpp``): one unit."""
    stem = os.path.splitext(name)[0]
    for candidate in [stem + suffix for suffix in SOURCE_SUFFIXES]:
        if os.path.normpath(os.path.join(ROOT, folder, candidate)) in paths:
            return True
        if re.search(r"(?<![\w./-])" + re.escape(candidate) + r"(?![\w-])", text):
            return True
    return False


def test_layout_tables_name_every_file_of_their_folders():
    rows = {}
    for doc, number, line, folder in _tables():
        if folder is None or not folder.startswith(LISTED_ROOTS) or LISTED_ELSEWHERE.get(folder, doc) != doc:
            continue
        rows.setdefault((doc, folder), []).append(line)
    assert ("docs/nki.md", "torchneuron/nki") in rows and ("README.md", "csrc/runtime") in rows
    unnamed = []
    for (doc, folder), lines in sorted(rows.items()):
        paths = set().union(*(_named_paths(doc, line, folder if doc != "README.md" else None) for line in lines))
        text = "\n".join(lines)
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            if (name.endswith(SOURCE_SUFFIXES) and name not in NOT_LISTED_FILES
                    and not _is_named(name, folder, paths, text)):
                unnamed.append(f"{folder}/{name} (not in {doc}'s table)")
    assert not unnamed, "source files their layout table does not name:\n" + "\n".join(unnamed)
