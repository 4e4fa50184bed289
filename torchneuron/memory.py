"""Memory reports for ``neuron``: summary, snapshot and allocation history, in
the formats of ``torch.cuda.memory`` so PyTorch's memory visualizer
(pytorch.org/memory_viz, or ``torch.cuda._memory_viz``) opens them."""
from __future__ import annotations

import pickle
from typing import Any

import torch

from . import _C


def _snapshot(device: Any = None) -> dict:
    """Segments and blocks of the caching allocator, plus recorded history."""
    return _C._memory_snapshot()


def memory_snapshot() -> list[dict]:
    return _snapshot()["segments"]


def _record_memory_history(enabled: Any = "all", *args, **kwargs) -> None:
    """Starts (or with ``None``/``False`` stops) recording allocator events."""
    _C._record_memory_history(enabled not in (None, False))


def _dump_snapshot(filename: str = "neuron_memory_snapshot.pickle") -> None:
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)


def _fmt(n: float) -> str:
    for unit in ("B  ", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:7.1f} {unit}" if unit != "B  " else f"{int(n):7d} {unit}"
        n /= 1024
    return str(n)


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A table of the allocator's statistics, like ``torch.cuda.memory_summary``."""
    from .device import _index, memory_stats

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
