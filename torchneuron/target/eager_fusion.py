"""Adaptive eager fusion on the target: runs of element-wise operators as one launch.

TorchNeuron's eager mode looks at the queued operators and fuses runs of them
into single device operations; reading a tensor ends the current fusion window,
and deterministic algorithms turn it off (TorchNeuron's eager-mode guide). AWS
does not publish which runs it fuses, so the twin assumes the plainest one: an
element-wise or reduction operator (Vector and Scalar engine work only) that
reads the result of the operator just before it, itself element-wise, joins
that operator's launch, up to ``figures.FUSED_OPS_MAX`` operators per launch. A
joined operator has no launch cost of its own, and its read of the previous
result stays on chip (its HBM traffic is the rest).
Anything else (a matmul, a gather, a copy, a collective, a compiled graph or
a kernel) ends the run.
"""
from __future__ import annotations

import threading
from dataclasses import replace

import torch

from .figures import FUSED_OPS_MAX, LogicalCore
from .roofline import OpCost, storage_identity, target_itemsize

_ELEMENTWISE_ENGINES = frozenset({"vector", "scalar", "hbm"})
_local = threading.local()


def _elementwise(cost: OpCost) -> bool:
    return not cost.flops and cost.engine_s.keys() <= _ELEMENTWISE_ENGINES and "hbm" in cost.engine_s \
        and len(cost.engine_s) > 1


def end_run() -> None:
    """The fusion window ends (a read, or a launch that is not element-wise)."""
    _local.tail = None


def join(cost: OpCost, inputs, results, core: LogicalCore) -> tuple[OpCost, bool]:
    """(the cost to charge, whether it joined the previous launch) for an operator on this
    thread, which becomes the run's newest member if it is element-wise."""
    tail = getattr(_local, "tail", None)
    if not _elementwise(cost) or len(results) != 1 or torch.are_deterministic_algorithms_enabled():
        _local.tail = None
        return cost, False
    result = results[0]
    members = tail[2] + 1 if tail is not None and tail[2] < FUSED_OPS_MAX and any(
        isinstance(t, torch.Tensor) and storage_identity(t) == tail[0] for t in inputs) else 1
    _local.tail = (storage_identity(result), result.numel() * target_itemsize(result.dtype), members)
    if members == 1:
        return cost, False
    nbytes = tail[1]
    joined = replace(cost, bytes=max(0, cost.bytes - nbytes), engine_s=dict(cost.engine_s), launch_s=0.0)
    joined.engine_s["hbm"] = joined.bytes / core.hbm_bytes_per_s
    return joined, True
