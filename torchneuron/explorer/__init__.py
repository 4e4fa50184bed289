"""The explorer: one self-contained HTML report of a profiler trace, showing where
the time went on `neuron` (summary and recommendations, timeline, operators,
memory, NKI kernels). See docs/explorer.md.

    torchneuron.explorer.report(prof, "report.html")      # a torch.profiler.profile
    python -m torchneuron.explorer trace.json -o report.html
    python -m torchneuron.explorer ./profile_output/<host>_pid_<pid>/<timestamp>   # torch_neuronx.profiling's output
"""
from __future__ import annotations

import os
import tempfile

from .. import target
from .analysis import analyze
from .render import render_html
from .trace_files import find_traces, load_trace, resolve_trace

__all__ = ["analyze", "find_traces", "load_trace", "render_html", "report"]


def _trace_of(source):
    """The trace dict of a profiler object (anything with export_chrome_trace), a path or a dict."""
    if hasattr(source, "export_chrome_trace"):
        fd, path = tempfile.mkstemp(suffix=".json", prefix="neuron_trace_")
        os.close(fd)
        try:
            source.export_chrome_trace(path)
            trace = load_trace(path)
        finally:
            os.unlink(path)
        return _with_target_model(trace)
    return load_trace(source)


def _with_target_model(trace: dict) -> dict:
    """The trace, with the Trainium twin's account of the profiled work and its modelled
    timeline when the twin is on and the trace has none (torchneuron.target.add_to_trace)."""
    if target.TRACE_KEY not in trace and target.active() is not None:
        target.add_model_to_trace(trace)
    return trace


def report(prof_or_trace, path="report.html", *, title=None) -> str:
    """Write the report of a profiler run, a trace file (.json or .json.gz), a
    profile output directory holding one trace, or a trace dict to `path`;
    returns the path."""
    name = title
    if isinstance(prof_or_trace, (str, os.PathLike)):
        prof_or_trace = resolve_trace(prof_or_trace)  # a profile output directory: its one trace
        if name is None:
            name = os.path.basename(prof_or_trace)
            if os.path.basename(prof_or_trace).startswith("trace.json"):
                # torch_neuronx.profiling's traces all have this name: the session's directories tell them apart.
                name = os.path.join(*os.path.normpath(prof_or_trace).split(os.sep)[-3:])
    if name is None:
        name = "profile"
    html = render_html(analyze(_trace_of(prof_or_trace)), title=f"neuron explorer: {name}")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(html)
    return path
