"""The Trainium twin: run here, see what the program does and costs on Trainium2 or Trainium3.

Off by default: the device keeps the CPU's exact semantics and its speed.
``TORCHNEURON_TARGET=trn2`` (or ``trn3``; with ``NEURON_LOGICAL_NC_CONFIG``
for the logical core size), or :func:`enable`, turns on a model of the target
built from AWS's public architecture and framework documentation
(``figures.py`` lists every figure and its source, docs/target.md every rule):

* behaviour as on the target: 64-bit types (``wide_types.py``), the device
  memory of one logical core (an allocation beyond it raises
  ``torch.OutOfMemoryError`` with the target's numbers), and the compile
  options TorchNeuron's backend refuses or ignores (``dynamic=True``, modes);
* compiles as the target makes them: each new eager operator signature and
  each compiled graph, with a modelled compile time, and shape churn reported;
* modelled device time on the target, by operator, engine and bound
  (``roofline.py``), read with :func:`summary` or for a window with
  :func:`measure`; ``python -m torchneuron.target`` turns a summary into time
  and cost per step, epoch or million tokens.
"""
from __future__ import annotations

import contextlib
import os

from .wide_types import TargetWarning

__all__ = ["enable", "disable", "active", "summary", "measure", "add_to_profiler", "add_to_trace",
           "profile_summary", "TargetWarning"]

#: The key of the twin's summary in a profiler trace (the explorer's "Modelled on the target" card).
TRACE_KEY = "neuronTargetModel"

_twin = None


def _lnc() -> int:
    text = os.environ.get("NEURON_LOGICAL_NC_CONFIG") or os.environ.get("NEURON_RT_VIRTUAL_CORE_SIZE") or "2"
    return int(text)


def enable(target: str = "trn2", *, lnc: int | None = None, wide: str = "warn"):
    """Turns the twin on for ``target`` ("trn2" or "trn3") from now on, on this thread,
    the threads started after it and the autograd threads; returns it. ``wide``: the 64-bit rule, "warn",
    "narrow" or "off". Enabling again replaces the twin (and its ledger)."""
    import torch

    from .twin import Twin

    global _twin
    if wide not in ("warn", "narrow", "off"):
        raise ValueError(f"wide={wide!r}: expected 'warn', 'narrow' or 'off'")
    disable()
    twin = Twin(target, lnc if lnc is not None else _lnc(), wide)
    twin.__enter__()
    twin.measure_entry_cost()
    twin.adopt_new_threads()
    _twin = twin
    from ..nki import torch_bridge
    from .nki_kernels import observer

    torch_bridge.launch_observer = observer(twin)
    # As TorchNeuron's backend: a shape seen for the first time recompiles the graph for
    # that shape rather than making its dimensions dynamic (undone by disable()).
    twin.dynamo_config = torch._dynamo.config.patch(automatic_dynamic_shapes=False)
    twin.dynamo_config.__enter__()
    return twin


def disable() -> None:
    """Turns the twin off (its ledger is dropped)."""
    global _twin
    if _twin is not None:
        twin, _twin = _twin, None
        from ..nki import torch_bridge

        torch_bridge.launch_observer = None
        twin.release_threads()
        try:
            twin.__exit__(None, None, None)
        except Exception:  # noqa: BLE001  (not on top of this thread's mode stack: dropped from it instead)
            from torch.utils._python_dispatch import _pop_mode

            with contextlib.suppress(Exception):
                _pop_mode()
        twin.dynamo_config.__exit__(None, None, None)


def active():
    """The twin in effect, or None."""
    return _twin


def _require():
    if _twin is None:
        raise RuntimeError("the Trainium twin is off: set TORCHNEURON_TARGET=trn2 (or trn3), "
                           "or call torchneuron.target.enable()")
    return _twin


def _describe(ledger, twin, steps: int | None) -> dict:
    import torch

    from . import figures

    core = twin.core
    d = ledger.as_dict()
    d.update({
        "target": core.key, "device": core.machine.device, "lnc": core.lnc,
        "modelled": True,
        "steps": steps,
        "device_s_per_step": d["device_s"] / steps if steps else None,
        "hbm_bytes": core.hbm_bytes,
        "peak_allocated_bytes": max((torch.neuron.max_memory_allocated(i) for i in range(torch.neuron.device_count())),
                                    default=0),
        "wide_findings": twin.wide.findings if twin.wide else 0,
        "wide_mode": twin.wide.mode if twin.wide else "off",
        "narrowed": twin.wide.narrowed if twin.wide else 0,
        "churn": list(twin.churn),
        "assumptions": dict(figures.ASSUMED),
        "figures": {"launch_us": figures.LAUNCH_US[core.key], "eager_compile_s": figures.EAGER_COMPILE_S,
                    "graph_compile_s": figures.GRAPH_COMPILE_S,
                    "graph_compile_s_per_node": figures.GRAPH_COMPILE_S_PER_NODE,
                    "tensor_tflops": {k: v * core.lnc for k, v in core.machine.tensor_tflops.items()},
                    "hbm_gb_per_s": core.hbm_bytes_per_s / 1e9},
    })
    return d


def summary(steps: int | None = None) -> dict:
    """What the program so far would have cost on the target, modelled (JSON-ready)."""
    twin = _require()
    if twin.wide:
        twin.wide.read()
    return _describe(twin.ledger.snapshot(), twin, steps)


class _Window:
    ledger = None
    summary = None


@contextlib.contextmanager
def measure(steps: int | None = None):
    """``with measure(steps=n) as w:`` charges only the block to ``w.summary``."""
    import torch

    twin = _require()
    torch.neuron.synchronize()
    twin.restart_host()
    before = twin.ledger.snapshot()
    w = _Window()
    yield w
    twin.settle()
    if twin.wide:
        twin.wide.read()
    w.ledger = twin.ledger.since(before)
    w.summary = _describe(w.ledger, twin, steps)


def profile_summary(steps: int | None = None) -> dict | None:
    """What the latest profiler run charged (from its first operator on the device), or None."""
    twin = _require()
    if twin.profile_start is None:
        return None
    if twin.wide:
        twin.wide.read()
    end = twin.profile_end or twin.ledger
    return _describe(end.since(twin.profile_start), twin, steps)


def add_to_profiler(prof, steps: int | None = None) -> None:
    """Puts the twin's account of the profiled work into a running ``torch.profiler``
    trace (call it inside the ``with``), where the explorer shows it. The explorer's
    ``report(prof)`` adds it by itself after the run."""
    import json

    summary = profile_summary(steps)
    if summary is not None:
        prof.add_metadata_json(TRACE_KEY, json.dumps(summary, default=str))


#: The process id of the modelled timeline's row in a chrome trace (beside the devices').
TIMELINE_PID = 1 << 20


def add_model_to_trace(trace: dict, steps: int | None = None) -> dict:
    """The trace dict, with the twin's account of the latest profiler run (``TRACE_KEY``)
    and a second device timeline: its launches at their modelled starts and durations
    (apart where the device waits for the host), from the first device task on, in a
    row "<target>, modelled"."""
    summary = profile_summary(steps)
    if summary is None:
        return trace
    trace[TRACE_KEY] = summary
    events = trace.setdefault("traceEvents", [])
    device = [e.get("ts") for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
              and isinstance(e.get("ts"), (int, float))]
    starts = [e.get("ts") for e in events if isinstance(e.get("ts"), (int, float))]
    t = min(device or starts or [0])
    row = f"{summary['target']}, modelled"
    events.append({"name": "process_name", "ph": "M", "pid": TIMELINE_PID, "tid": 0, "args": {"name": row}})
    events.append({"name": "thread_name", "ph": "M", "pid": TIMELINE_PID, "tid": 0,
                   "args": {"name": "launches (modelled, not measured)"}})
    first = _twin.timeline[0][1] if _twin.timeline else 0.0
    for name, start, seconds, bound, engine in _twin.timeline:
        events.append({"name": name, "cat": "neuron_modelled", "ph": "X", "pid": TIMELINE_PID, "tid": 0,
                       "ts": t + (start - first) * 1e6, "dur": seconds * 1e6, "args": {"bound": bound, "engine": engine}})
    return trace


def add_to_trace(path: str, steps: int | None = None) -> None:
    """Adds the twin's account of the latest profiler run and its modelled timeline to the
    chrome trace written to ``path`` (an ``on_trace_ready`` handler's export, for example)."""
    import json

    with open(path) as f:
        trace = json.load(f)
    with open(path, "w") as f:
        json.dump(add_model_to_trace(trace, steps), f, default=str)


def _machine_from_environment() -> None:
    """Before the runtime starts: TORCHNEURON_TARGET chooses the machine model, so the
    device's properties are the target's (a different TORCHNEURON_MACHINE is an error)."""
    from .. import environment

    target = environment.value("TORCHNEURON_TARGET")
    if target in (None, "off"):
        return
    machine = os.environ.get("TORCHNEURON_MACHINE")
    if machine:
        from ..nki.machine import resolve_machine

        if resolve_machine(machine).key != target:
            raise environment.ConfigError(
                f"TORCHNEURON_TARGET={target!r} and TORCHNEURON_MACHINE={machine!r} name different machines; "
                f"set one of them")
    else:
        os.environ["TORCHNEURON_MACHINE"] = target


def _enable_from_environment() -> None:
    from .. import environment

    target = environment.value("TORCHNEURON_TARGET")
    if target in (None, "off"):
        return
    enable(target, wide=environment.value("TORCHNEURON_TARGET_64BIT"))
    import atexit

    # Before the exit drain (registered earlier, so run later): the autograd threads
    # must not be left holding the mode, a Python object, while the interpreter ends.
    atexit.register(disable)
