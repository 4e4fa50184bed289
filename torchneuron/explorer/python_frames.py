"""Python frames as the profiler names them (``file(line): function``): which
are the user's own code, and how the report labels them."""
from __future__ import annotations

import functools
import importlib.metadata
import re
import sys

PY_FRAME = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<func>.*)$")
BUILTIN_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>$")


def _library_roots() -> frozenset:
    """Top-level names of code that is not the user's: the standard library and installed packages."""
    roots = set(sys.stdlib_module_names) | {"torch", "torchneuron", "torch_neuronx"}
    try:
        roots |= set(importlib.metadata.packages_distributions())
    except Exception:  # noqa: BLE001 - a broken environment only loses this refinement
        pass
    return frozenset(roots)


_LIBRARY_ROOTS = None


def parse_frame(name: str):
    """(file, line, function) of a python_function event's name, or None for built-ins.
    The line is where the function starts (the profiler records frames at their call)."""
    m = PY_FRAME.match(name)
    if not m:
        return None
    return m.group("file"), int(m.group("line")), m.group("func")


@functools.lru_cache(maxsize=None)
def is_user_frame(name: str) -> bool:
    """A frame of the user's own code: not built-in, not the standard library, not an installed package."""
    global _LIBRARY_ROOTS
    parsed = parse_frame(name)
    if parsed is None:
        return False
    path = parsed[0].replace("\\", "/")
    if path.startswith("<") or any(d in path for d in ("site-packages/", "dist-packages/", "/lib/python3")):
        return False
    if _LIBRARY_ROOTS is None:
        _LIBRARY_ROOTS = _library_roots()
    first = path.split("/")[0]
    return (first[:-3] if first.endswith(".py") else first) not in _LIBRARY_ROOTS


def frame_label(name: str) -> str:
    """A frame as "function (file:line)", built-ins without their object address."""
    parsed = parse_frame(name)
    if parsed is None:
        return BUILTIN_ADDRESS.sub(">", name)
    file, line, func = parsed
    return f"{func} ({file}:{line})"
