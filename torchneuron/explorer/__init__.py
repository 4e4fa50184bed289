"""The explorer: one self-contained HTML report of a profiler trace, showing where
the time went on `neuron` (summary and recommendations, timeline, operators,
memory, NKI kernels). See docs/explorer.md.

    torchneuron.explorer.report(prof, "report.html")      # a torch.profiler.profile
    python -m torchneuron.explorer trace.json -o report.html
"""
from __future__ import annotations

import os
import tempfile

from .analysis import analyze, load_trace
from .render import render_html

__all__ = ["analyze", "load_trace", "render_html", "report"]


def _trace_of(source):
    """The trace dict of a profiler object (anything with export_chrome_trace), a path or a dict."""
    if hasattr(source, "export_chrome_trace"):
        fd, path = tempfile.mkstemp(suffix=".json", prefix="neuron_trace_")
        os.close(fd)
        try:
            source.export_chrome_trace(path)
            return load_trace(path)
        finally:
            os.unlink(path)
    return load_trace(source)


def report(prof_or_trace, path="report.html", *, title=None) -> str:
    """Write the report of a profiler run, a trace file (.json or .json.gz) or a
    trace dict to `path`; returns the path."""
    name = title
    if name is None:
        name = os.path.basename(os.fspath(prof_or_trace)) if isinstance(prof_or_trace, (str, os.PathLike)) \
            else "profile"
    html = render_html(analyze(_trace_of(prof_or_trace)), title=f"neuron explorer: {name}")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(html)
    return path
