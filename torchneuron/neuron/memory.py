"""Memory reports for ``neuron``: summary, snapshot and allocation history, in
the formats of ``torch.cuda.memory`` so PyTorch's memory visualizer
(pytorch.org/memory_viz, or ``torch.cuda._memory_viz``) opens them."""
from __future__ import annotations

import inspect
import pickle
import sys
import warnings
from typing import Any

import torch

from .. import _C
from . import _index, memory_stats

# also torch.neuron.<name> (this package's __init__.py), as torch.cuda has them at its top level
ON_DEVICE_MODULE = ("_dump_snapshot", "_record_memory_history", "_snapshot", "host_memory_stats",
                    "host_memory_stats_as_nested_dict", "memory_snapshot", "memory_summary",
                    "reset_accumulated_host_memory_stats", "reset_peak_host_memory_stats")

# What _record_memory_history asked for and the allocator does not do itself:
# it records every event of every device, and a snapshot returns the newest
# `max_entries` of those not skipped, as CUDA's ring buffer would hold them.
_history_max_entries = sys.maxsize
_history_skip_actions: frozenset[str] = frozenset()


def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict:
    """Segments and blocks of the caching allocator, and the recorded history.

    The format is ``torch.cuda.memory._snapshot()``'s. With ``device=None`` it
    covers every device, as CUDA's snapshot does; with a device (index, string
    or ``torch.device``) only that device's segments and history, the history
    still at ``device_traces[index]`` (the other devices' lists are empty). A
    device of another type raises ``ValueError``, an invalid index
    ``IndexError``, as ``torch.neuron.memory_stats`` does.
    ``augment_with_fx_traces`` adds FX node information to the frames, with
    PyTorch's own helper.
    """
    index = None
    if device is not None:
        index = _index(device)
        _C._device_properties(index)  # raises for an invalid index
    snapshot = _C._memory_snapshot()
    if index is not None:
        snapshot["segments"] = [s for s in snapshot["segments"] if s["device"] == index]
    traces = snapshot["device_traces"]
    for d, events in enumerate(traces):
        if index is not None and d != index:
            events = []
        elif _history_skip_actions:
            events = [e for e in events if e["action"] not in _history_skip_actions]
        if len(events) > _history_max_entries:
            events = events[len(events) - _history_max_entries:]
        traces[d] = events
    if augment_with_fx_traces:
        from torch._utils import _augment_memory_snapshot_stack_traces

        snapshot = _augment_memory_snapshot_stack_traces(snapshot)
    return snapshot


def memory_snapshot() -> list[dict]:
    """The segments of every device (``torch.cuda.memory_snapshot()``)."""
    return _snapshot()["segments"]


def _check_option(value: Any, name: str, valid: tuple, optional: bool) -> None:
    # The checks of torch.cuda's C++ binding: a value of the wrong type is a
    # TypeError (its argument conversion), an unknown string a RuntimeError.
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise TypeError(f"_record_memory_history(): {name} must be a string{' or None' if optional else ''}, "
                        f"got {type(value).__name__}")
    if value not in valid:
        names = [repr(v) for v in valid] + (["None"] if optional else [])
        choices = ", ".join(names[:-1]) + f" or {names[-1]}"
        raise RuntimeError(f"expected {name} to be {choices}")


def _set_history(enabled: bool, context: str | None, stacks: str, max_entries: int, skip_actions: Any,
                 clear_history: bool) -> None:
    global _history_max_entries, _history_skip_actions
    if clear_history:
        _C._record_memory_history(False)  # turning recording off clears the history
    _C._record_memory_history(enabled, context, stacks)
    _history_max_entries = max(1, max_entries)
    _history_skip_actions = frozenset(skip_actions or ())


def _record_memory_history(enabled: Any = "all", *args: Any, **kwargs: Any) -> None:
    """Starts (``"all"`` or ``"state"``) or stops (``None``) recording allocator events.

    The arguments are ``torch.cuda.memory._record_memory_history``'s, checked
    as it checks them; a bool first argument takes its legacy form
    (``enabled, record_context=True, trace_alloc_max_entries=1, ...``).
    ``"all"`` keeps the newest ``max_entries`` events of every device,
    ``"state"`` only the newest one, as on CUDA; the events are those of
    ``_snapshot()["device_traces"]``, ``skip_actions`` left out. Recording
    applies to every device (``device`` is accepted and, as on CUDA, unused),
    and stopping clears the history.

    Stack traces, as on CUDA: ``context="state"`` keeps them for live
    allocations (the snapshot's blocks), ``"alloc"`` also for allocation
    events, ``"all"`` also for frees; ``stacks="python"`` records Python
    frames, ``"all"`` C++ frames too. Python frames are those of the thread
    that allocates, while it holds the GIL. ``compile_context`` and
    ``global_record_annotations`` have nothing to record. The allocator keeps
    every event while recording: ``max_entries`` bounds what a snapshot
    returns, not the memory the history takes.
    """
    if isinstance(enabled, bool):
        _record_memory_history_legacy(enabled, *args, **kwargs)
    else:
        _record_memory_history_impl(enabled, *args, **kwargs)


def _record_memory_history_impl(
    enabled: str | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: list[str] | None = None,
) -> None:
    _check_option(enabled, "enabled", ("state", "all"), optional=True)
    _check_option(context, "context", ("state", "alloc", "all"), optional=True)
    _check_option(stacks, "stacks", ("python", "all"), optional=False)
    if not isinstance(max_entries, int) or max_entries < 0:
        raise TypeError(f"_record_memory_history(): max_entries must be a non-negative int, got {max_entries!r}")
    _set_history(enabled is not None, context, stacks, max_entries if enabled == "all" else 1, skip_actions,
                 clear_history)


_record_memory_history.__signature__ = inspect.signature(_record_memory_history_impl)


def _record_memory_history_legacy(
    enabled: bool,
    record_context: bool = True,
    trace_alloc_max_entries: int = 1,
    trace_alloc_record_context: bool = False,
    device: Any = None,
    record_context_cpp: bool = False,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: list[str] | None = None,
) -> None:
    # CUDA's legacy mapping: record_context keeps frames of live blocks,
    # trace_alloc_record_context of allocation events too.
    context = ("alloc" if trace_alloc_record_context else "state") if record_context else None
    _set_history(enabled, context, "all" if record_context_cpp else "python", trace_alloc_max_entries, skip_actions,
                 clear_history)


def _dump_snapshot(filename: str = "neuron_memory_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
    """Pickles ``_snapshot()`` to ``filename``, for pytorch.org/memory_viz."""
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(augment_with_fx_traces=augment_with_fx_traces), f)


def _fmt(n: float) -> str:
    for unit in ("B  ", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:7.1f} {unit}" if unit != "B  " else f"{int(n):7d} {unit}"
        n /= 1024
    return str(n)


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A table of the allocator's statistics, like ``torch.cuda.memory_summary``."""
    idx = _index(device)
    stats = memory_stats(idx)
    rows = [
        ("Allocated memory", "allocated_bytes", True),
        ("Active memory", "active_bytes", True),
        ("Requested memory", "requested_bytes", True),
        ("Reserved memory", "reserved_bytes", True),
        ("Non-releasable memory", "inactive_split_bytes", True),
        ("Allocations", "allocation", False),
        ("Active allocs", "active", False),
        ("Segments", "segment", False),
    ]
    line = "=" * 79
    out = [line, f" neuron:{idx} memory summary ({torch.neuron.get_device_name(idx)})", line,
           f" {'Metric':<24}| {'Cur Usage':>11} | {'Peak Usage':>11} | {'Tot Alloc':>11} | {'Tot Freed':>11}", line]
    for label, key, is_bytes in rows:
        vals = [stats.get(f"{key}.all.{k}", 0) for k in ("current", "peak", "allocated", "freed")]
        cells = [_fmt(v) if is_bytes else f"{v:7d}    " for v in vals]
        out.append(f" {label:<24}| {cells[0]:>11} | {cells[1]:>11} | {cells[2]:>11} | {cells[3]:>11}")
    out.append(line)
    out.append(f" OOMs: {stats.get('num_ooms', 0)}   cache-flush retries: {stats.get('num_alloc_retries', 0)}")
    out.append(line)
    return "\n".join(out)


# --- pinned host memory (csrc/bridge/host_allocator.h), as torch.cuda reports it

def host_memory_stats_as_nested_dict() -> dict[str, Any]:
    """The pinned host allocator's statistics, nested as
    ``torch.cuda.host_memory_stats_as_nested_dict()`` returns them."""
    return _C._host_memory_stats()


def host_memory_stats() -> dict[str, Any]:
    """The pinned host allocator's statistics, flat, with the keys of
    ``torch.cuda.host_memory_stats()``: ``allocations``, ``allocated_bytes``,
    ``active_requests`` and ``active_bytes`` (each ``.current``, ``.peak``,
    ``.allocated``, ``.freed``), ``num_host_alloc``, ``num_host_free`` and the
    ``host_alloc_time`` / ``host_free_time`` durations in microseconds. Blocks
    are powers of two of at least 4 KiB, so byte counts are the rounded sizes."""
    flat: dict[str, Any] = {}

    def add(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                add(f"{prefix}.{k}" if prefix else k, v)
        else:
            flat[prefix] = value

    add("", host_memory_stats_as_nested_dict())
    return dict(sorted(flat.items()))


def reset_accumulated_host_memory_stats() -> None:
    """Resets the ``allocated``/``freed`` counts, the counters and the timings."""
    _C._reset_accumulated_host_memory_stats()


def reset_peak_host_memory_stats() -> None:
    """Resets the ``peak`` values to the current ones."""
    _C._reset_peak_host_memory_stats()
