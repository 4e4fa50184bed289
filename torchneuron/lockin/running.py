"""Runs a program (a script or a notebook's code cells) in this process, as
``python script.py ARGS`` would: inside redirect.py's :class:`Redirection`,
or as it is (``target=None``)."""
from __future__ import annotations

import contextlib
import linecache
import os
import runpy
import sys
import traceback

from .redirect import Redirection
from .source import read_notebook


def _run_notebook(path: str, recorder=None) -> None:
    source = read_notebook(path)
    filename = os.path.abspath(path)
    lines = source.text.splitlines(keepends=True)
    linecache.cache[filename] = (len(source.text), None, lines, filename)   # tracebacks and snippets
    if recorder is not None:
        recorder.line_map = (filename, lambda line: source.location(line), path)
    code = compile(source.text, filename, "exec")
    exec(code, {"__name__": "__main__", "__file__": filename})


def run_program(script: str, args: list[str], target: str | None = "neuron",
                program_files: list[str] | None = None) -> tuple[int, list[dict]]:
    """(exit status, the call sites that needed redirection)."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    code = 0
    redirection = Redirection(target, program_files or [script]) if target else None
    try:
        with redirection or contextlib.nullcontext():
            try:
                if script.endswith(".ipynb"):
                    _run_notebook(script, redirection.recorder if redirection else None)
                else:
                    runpy.run_path(script, run_name="__main__")
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:   # the program's own failure: reported, and the sites kept
                traceback.print_exc()
                code = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return code, redirection.sites if redirection else []
