"""Compilation metrics of the ``neuron`` backend, as TorchNeuron reports them.

One :class:`NeuronCompilationMetrics` per graph the backend compiles (a training
step's forward and backward are two), in TorchNeuron's fields, read with
``torch_neuronx.get_dynamo_metrics()``. The three timings map TorchNeuron's stages
onto Inductor's: its FX passes (Inductor's pre- and post-grad passes), its lowering
(Inductor's lowering and code generation) and its NEFF compile (the C++ compile
and load of the generated module).

A graph AOTAutograd's cache serves is loaded, not compiled: it is recorded with
zero timings, as TorchNeuron records a cache hit. ``TORCH_NEURONX_ENABLED_METRIC_TABLES
=graph_stats`` writes the table to
``$TORCH_NEURONX_METRICS_DIR/metric_table_graph_stats_rank<rank>.csv`` at exit.
"""
from __future__ import annotations

import atexit
import csv
import dataclasses
import datetime
import hashlib
import os
import threading
from typing import Callable

import torch

from .. import environment, target
from ..target import figures
from ..target.roofline import graph_cost

_lock = threading.Lock()
_records: list["NeuronCompilationMetrics"] = []
_model_name: str | None = None
DEFAULT_MODEL_NAME = "model_default"
TABLES = ("graph_stats",)

# Inductor's dynamo_timed keys, per TorchNeuron stage; a key's prefix ends with ".".
_STAGES = {
    "torch_neuronx_fx_passes_us": ("pass.",),
    "torch_neuronx_lower_us": ("GraphLowering.run", "GraphLowering.codegen"),
    "torch_neuronx_compile_us": ("PyCodeCache.load_by_key_path",),
}
_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


@dataclasses.dataclass
class NeuronCompilationMetrics:
    """One compiled graph, in TorchNeuron's fields."""

    graph_id: str
    graph_name: str = ""
    model_name: str = ""
    has_collectives: bool = False
    graph_node_count: int = 0
    timestamp: str = ""
    torch_neuronx_fx_passes_us: int = 0
    torch_neuronx_lower_us: int = 0
    torch_neuronx_compile_us: int = 0


def set_model_name(name: str) -> None:
    """Names the model in later graphs' ``model_name`` and ``graph_name``."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"set_model_name takes a non-empty str, not {name!r}")
    global _model_name
    _model_name = name


def get_model_name() -> str:
    return _model_name or DEFAULT_MODEL_NAME


def get_dynamo_metrics() -> list[NeuronCompilationMetrics]:
    """A copy of the records, one per compiled graph, oldest first. Synchronizes the
    device first, as TorchNeuron does (its compile timings arrive asynchronously)."""
    torch.neuron.synchronize()
    with _lock:
        return [dataclasses.replace(r) for r in _records]


def reset_dynamo_metrics() -> None:
    """Forgets the records and the ``counters["neuron"]`` counters."""
    from torch._dynamo.utils import counters

    with _lock:
        _records.clear()
    counters["neuron"].clear()


def _timings() -> dict[str, int]:
    from torch._dynamo.utils import compilation_time_metrics

    return {k: len(v) for k, v in compilation_time_metrics.items()}


def _stage_us(before: dict[str, int]) -> dict[str, int]:
    from torch._dynamo.utils import compilation_time_metrics

    us = dict.fromkeys(_STAGES, 0)
    for key, values in compilation_time_metrics.items():
        new = values[before.get(key, 0):]
        for stage, names in _STAGES.items():
            if any(key == n or (n.endswith(".") and key.startswith(n)) for n in names):
                us[stage] += int(sum(new) * 1e6)
    return us


def _has_collectives(gm: torch.fx.GraphModule) -> bool:
    for n in gm.graph.nodes:
        if n.op == "call_function":
            name = str(getattr(n.target, "__name__", n.target))
            if any(c in name for c in _COLLECTIVES):
                return True
    return False


def _record(m: NeuronCompilationMetrics, seconds: float) -> None:
    from torch._dynamo.utils import compilation_time_metrics, counters, cumulative_time_spent_ns

    with _lock:
        _records.append(m)
    counters["neuron"]["compiled_graphs"] += 1
    if m.has_collectives:
        counters["neuron"]["graphs_with_collectives"] += 1
    # Dynamo's time reports (calculate_time_spent()) then list the backend's share, as on TorchNeuron.
    compilation_time_metrics.setdefault("torch_neuronx_compile", []).append(seconds)
    cumulative_time_spent_ns["torch_neuronx_compile"] += int(seconds * 1e9)


def _now() -> str:
    return datetime.datetime.now().strftime("%Y%m%d_%H%M%S_%f")


def recording(inner_compile: Callable, model_name: str) -> Callable:
    """Inductor's inner compiler (one call per forward, backward or inference graph),
    recording each graph it compiles."""

    def compile_and_record(gm, example_inputs, *args, **kwargs):
        from torch._functorch._aot_autograd.logging_utils import get_aot_graph_name

        before = _timings()
        out = inner_compile(gm, example_inputs, *args, **kwargs)
        us = _stage_us(before)
        aot_name = get_aot_graph_name()  # "model__<aot id>_<forward|backward|inference>_<n>"
        key = getattr(out, "cache_key", None) or hashlib.sha256(gm.code.encode()).hexdigest()[:32]
        _record(NeuronCompilationMetrics(
            graph_id=str(key), graph_name=f"{model_name}_{aot_name.split('__', 1)[-1]}", model_name=model_name,
            has_collectives=_has_collectives(gm), graph_node_count=len(gm.graph.nodes), timestamp=_now(), **us),
            sum(us.values()) / 1e6)
        return _charged_on_target(gm, out)

    return compile_and_record


def _charged_on_target(gm: torch.fx.GraphModule, compiled):
    """With the Trainium twin on: the graph counts as one compile, and each launch of
    it is charged its modelled cost as one task (its operators are not charged apart)."""
    twin = target.active()
    if twin is None:
        return compiled
    nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    twin.ledger.compiled(figures.GRAPH_COMPILE_S + figures.GRAPH_COMPILE_S_PER_NODE * nodes, graph=True)
    cost = graph_cost(gm, twin.core)
    from torch._functorch._aot_autograd.logging_utils import get_aot_graph_name

    name = f"compiled graph {get_aot_graph_name()}"

    def launch(args):
        with twin.graph_launch(name, cost):
            return compiled(args)

    launch._boxed_call = True
    return launch


def record_cache_hits(gm: torch.fx.GraphModule, model_name: str, graphs: int) -> None:
    """Records the `graphs` graphs AOTAutograd's cache served for Dynamo graph `gm`."""
    compile_id = torch._guards.CompileContext.current_compile_id()
    for i in range(graphs):
        _record(NeuronCompilationMetrics(
            graph_id=hashlib.sha256(gm.code.encode()).hexdigest()[:32] + f"_{i}",
            graph_name=f"{model_name}_{compile_id}_cached_{i}".replace("/", "_"), model_name=model_name,
            has_collectives=_has_collectives(gm), graph_node_count=len(gm.graph.nodes), timestamp=_now()), 0.0)


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


def enabled_tables() -> list[str]:
    """``TORCH_NEURONX_ENABLED_METRIC_TABLES``, checked: an unknown table is a ValueError."""
    names = [t.strip() for t in (environment.value("TORCH_NEURONX_ENABLED_METRIC_TABLES") or "").split(",") if t.strip()]
    unknown = [t for t in names if t not in TABLES]
    if unknown:
        raise ValueError(f"TORCH_NEURONX_ENABLED_METRIC_TABLES names unknown metric table(s) "
                         f"{', '.join(unknown)}; the tables are: {', '.join(TABLES)}")
    return names


def write_tables(directory: str | None = None) -> list[str]:
    """Writes the enabled tables as CSV; returns the paths written."""
    if "graph_stats" not in enabled_tables():
        return []
    directory = directory or str(environment.value("TORCH_NEURONX_METRICS_DIR"))
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"metric_table_graph_stats_rank{_rank()}.csv")
    fields = [f.name for f in dataclasses.fields(NeuronCompilationMetrics)]
    with _lock, open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(dataclasses.asdict(r) for r in _records)
    return [path]


def _write_at_exit() -> None:
    try:
        write_tables()
    except Exception as e:  # noqa: BLE001  (at exit: say it, do not mask the program's own status)
        import sys

        print(f"torchneuron: could not write the compilation metric tables: {e}", file=sys.stderr)


enabled_tables()  # a bad table name is an error at start-up, not at exit
atexit.register(_write_at_exit)
