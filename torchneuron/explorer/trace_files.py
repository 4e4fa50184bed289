"""Trace files: a profiler trace found in a profile output directory and read
from ``.json`` or ``.json.gz``."""
from __future__ import annotations

import gzip
import json
import os
import re

# Framework traces in a profile output directory: torch_neuronx.profiling's
# (``<dir>/<host>_pid_<pid>/<timestamp>/trace.json``), the name TorchNeuron's
# troubleshooting guide gives one, and tensorboard_trace_handler's.
TRACE_NAMES = re.compile(r"^(trace\.json|neuron_framework_trace_rank_\d+\.json|.*\.pt\.trace\.json)(\.gz)?$")


def find_traces(directory) -> list:
    """The framework traces under `directory`, sorted by path."""
    found = []
    for root, _, files in os.walk(os.fspath(directory)):
        found += [os.path.join(root, f) for f in files if TRACE_NAMES.match(f)]
    return sorted(found)


def resolve_trace(source) -> str:
    """A trace file's path from a file or a profile output directory holding
    exactly one trace (several: name one; the error lists them)."""
    path = os.fspath(source)
    if not os.path.isdir(path):
        return path
    traces = find_traces(path)
    if not traces:
        raise FileNotFoundError(f"no profiler trace (trace.json, neuron_framework_trace_rank_<N>.json or "
                                f"*.pt.trace.json) under the directory {path}")
    if len(traces) > 1:
        listed = "\n  ".join(traces)
        raise ValueError(f"the directory {path} holds {len(traces)} traces (one per rank and per trace-ready "
                         f"call); name one of them, or the directory that holds it:\n  {listed}")
    return traces[0]


def load_trace(source) -> dict:
    """A trace dict from a path (``.json`` or ``.json.gz``, or a directory
    holding one such trace) or a dict (returned as is)."""
    if isinstance(source, dict):
        return source
    path = resolve_trace(source)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)
