"""The device memory checker (``TORCHNEURON_MEMCHECK=1``; docs/sanitizers.md).

The checking is in C++ (csrc/runtime/memcheck.h: host access protection;
csrc/bridge/sanitizers/memcheck.h: poisoning, redzones, record_stream); this module turns
its reports into exceptions on Python's main thread, at the first bytecode
after the C++ side queued them. ``TORCHNEURON_MEMCHECK=warn`` warns instead.
"""
from __future__ import annotations

import linecache
import os
import traceback
import warnings

from .. import _C

__all__ = ["MemcheckError", "MemcheckWarning", "MemcheckReport", "enabled", "protecting", "reports", "stats"]


class MemcheckReport:
    """One finding: ``kind`` ("host access", "write after free", "out of bounds",
    "missing record_stream"), ``message``, ``stacks`` [(title, frames)] and,
    for a host access, ``place``: the Python stack where it was noticed."""

    def __init__(self, kind: str, message: str, stacks, place: str | None):
        self.kind, self.message, self.stacks, self.place = kind, message, stacks, place

    def __str__(self) -> str:
        out = [f"neuron memory checker: {self.kind}: {self.message}"]
        if self.place:
            out.append("  at (the Python code running when the access happened)\n" + self.place)
        for title, frames in self.stacks:
            out.append(f"  {title}\n" + _format_frames(frames))
        return "\n".join(out)


class MemcheckError(RuntimeError):
    def __init__(self, found: list[MemcheckReport]):
        self.reports = found
        super().__init__("\n".join(str(r) for r in found))


class MemcheckWarning(UserWarning):
    pass


_OWN = (os.path.abspath(__file__),)
_seen: list[MemcheckReport] = []
_action = "raise"


def _format_frames(frames) -> str:
    if frames is None:
        return "      (not captured: the event happened on a thread without Python)\n"
    lines = []
    for f in [f for f in frames if f["filename"] not in _OWN][:12]:  # innermost first
        lines.append(f'      File "{f["filename"]}", line {f["line"]}, in {f["name"]}\n')
        if source := linecache.getline(f["filename"], f["line"]).strip():
            lines.append(f"        {source}\n")
    return "".join(lines) or "      (no Python frames)\n"


def _place() -> str:
    stack = [f for f in traceback.extract_stack()[:-2] if f.filename not in _OWN]
    return "".join(traceback.format_list(stack[-12:]))


def _on_reports() -> None:
    found = [MemcheckReport(r["kind"], r["message"], r["stacks"], _place() if r["python_stack"] else None)
             for r in _C._memcheck_take_reports()]
    if not found:
        return
    _seen.extend(found)
    if _action == "warn":
        for r in found:
            warnings.warn(str(r), MemcheckWarning, stacklevel=2)
        return
    raise MemcheckError(found)


def enabled() -> bool:
    return _C._memcheck_enabled()


def protecting() -> bool:
    """Whether host reads and writes of device memory fault (memory protection keys)."""
    return _C._memcheck_protecting()


def reports() -> list[MemcheckReport]:
    """Every report delivered so far in this process."""
    return list(_seen)


def stats() -> dict:
    """Counters: blocks poisoned, handed-out blocks checked and left unchecked, redzone checks, reports."""
    return _C._memcheck_stats()


def _enable_from_environment() -> None:
    global _action
    if not _C._memcheck_enabled():
        return
    _action = "warn" if os.environ.get("TORCHNEURON_MEMCHECK", "").strip().lower() == "warn" else "raise"
    _C._memcheck_start(_on_reports)
    if not _C._memcheck_protecting():
        warnings.warn("TORCHNEURON_MEMCHECK: host access protection is off ("
                      f"{_C._memcheck_protection_off_reason()}); poisoning, redzones and the record_stream "
                      "check still run", RuntimeWarning, stacklevel=2)
