"""A notebook's code cells rewritten in its JSON text, the rest of the file kept
byte for byte.

Jupyter, Colab and VS Code each write a notebook's JSON their own way (the
indent, the order of keys, ASCII escapes, a final newline or none). Writing
the notebook back with the json module would re-indent the whole file for
one changed line, so --fix edits the text instead: it finds where each cell's
``source`` value stands, replaces only the values of the cells that changed,
and inside a list of lines keeps every line that did not change as it was
written, adding the new ones in the list's own layout.
"""
from __future__ import annotations

import difflib
import json
import re

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _skip(text: str, i: int) -> int:
    return _WS.match(text, i).end()


def _members(text: str, i: int):
    """(key, value start, value end) of the JSON object starting at ``text[i]``."""
    if text[i] != "{":
        raise ValueError(f"a JSON object expected at character {i}")
    i = _skip(text, i + 1)
    if text[i] == "}":
        return
    while True:
        key, i = json.decoder.scanstring(text, i + 1)
        i = _skip(text, _skip(text, i) + 1)   # past the colon
        _, end = _DECODER.raw_decode(text, i)
        yield key, i, end
        i = _skip(text, end)
        if text[i] == "}":
            return
        i = _skip(text, i + 1)   # past the comma


def _elements(text: str, i: int) -> list[tuple[int, int]]:
    """(start, end) of each element of the JSON array starting at ``text[i]``."""
    if text[i] != "[":
        raise ValueError(f"a JSON array expected at character {i}")
    out = []
    i = _skip(text, i + 1)
    if text[i] == "]":
        return out
    while True:
        _, end = _DECODER.raw_decode(text, i)
        out.append((i, end))
        i = _skip(text, end)
        if text[i] == "]":
            return out
        i = _skip(text, i + 1)


def source_spans(text: str) -> dict[int, tuple[int, int]]:
    """Cell index (from 1, among all cells) -> (start, end) of its ``source`` value."""
    cells = next(((s, e) for key, s, e in _members(text, _skip(text, 0)) if key == "cells"), None)
    if cells is None:
        return {}
    spans = {}
    for index, (start, _) in enumerate(_elements(text, cells[0]), start=1):
        for key, s, e in _members(text, start):
            if key == "source":
                spans[index] = (s, e)
    return spans


def _line_start(text: str, i: int) -> int:
    return text.rfind("\n", 0, i) + 1


def _list_value(text: str, start: int, end: int, lines: list[str], ascii_only: bool) -> str:
    """A JSON list of ``lines`` in the layout of the list at ``text[start:end]``, its
    unchanged lines as they were written there."""
    elements = _elements(text, start)
    raw = [text[s:e] for s, e in elements]
    old = [json.loads(r) for r in raw]
    if elements:
        opening, closing = text[start + 1:elements[0][0]], text[elements[-1][1]:end - 1]
    else:   # an empty list: one indent deeper than the line of its key
        indent = re.match(r"[ \t]*", text[_line_start(text, start):]).group()
        step = re.search(r"\n([ \t]+)\S", text)
        opening, closing = "\n" + indent + (step.group(1) if step else " "), "\n" + indent
    separator = text[elements[0][1]:elements[1][0]] if len(elements) > 1 else "," + opening
    new = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=lines, autojunk=False).get_opcodes():
        if tag == "equal":
            new += raw[i1:i2]
        else:
            new += [json.dumps(line, ensure_ascii=ascii_only) for line in lines[j1:j2]]
    if not new:
        return "[]"
    return "[" + opening + separator.join(new) + closing + "]"


def rewrite_cells(text: str, sources: dict[int, str]) -> str:
    """``text`` (a notebook's JSON) with the ``source`` of each cell in ``sources``
    (index from 1 -> its new text) replaced; everything else byte for byte."""
    spans = source_spans(text)
    # a file that escapes non-ASCII characters gets new lines escaped the same way
    ascii_only = text.isascii() and re.search(r"\\u(?!00[0-7])[0-9a-fA-F]{4}", text) is not None
    out, at = [], 0
    for index in sorted(sources):
        start, end = spans[index]
        new = sources[index]
        if text[start] == "[":
            value = _list_value(text, start, end, new.splitlines(keepends=True), ascii_only)
        else:
            value = json.dumps(new, ensure_ascii=ascii_only)
        out += [text[at:start], value]
        at = end
    out.append(text[at:])
    return "".join(out)
