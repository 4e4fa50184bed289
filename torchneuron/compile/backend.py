"""The Dynamo backend ``neuron``: Inductor with the ``neuron`` device.

``torch.compile(model, backend="neuron", mode=..., options=...)``:

* Dynamo hands each graph here; AOTAutograd (inside Inductor's ``compile_fx``)
  splits forward and backward, Inductor lowers both and generates C++ kernels
  plus a Python wrapper that queues them on the current stream.
* ``mode``: ``"default"``, ``"reduce-overhead"`` (record and replay each
  graph's device work, replay.py), ``"max-autotune"``,
  ``"max-autotune-no-cudagraphs"`` (see :data:`MODES`).
* ``options``: Inductor config keys (as for ``backend="inductor"``) plus
  ``fallback_execution`` (bool: run a graph that fails to compile eagerly,
  with a warning, instead of raising) and ``allow_cpu_inputs`` (bool: accept
  CPU tensors among a graph's inputs; by default a graph whose tensors are on
  ``neuron`` and whose inputs include a CPU tensor with at least one
  dimension raises, since that is almost always a forgotten ``.to("neuron")``).
"""
from __future__ import annotations

import collections
import warnings
from typing import Any

import torch

# Inductor config for each mode. CUDA graphs do not exist here:
# "reduce-overhead" records and replays each graph's device tasks instead
# (replay.py; Inductor's own config unchanged) and "max-autotune" turns on
# Inductor's autotuning flags without CUDA graphs.
MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "reduce-overhead": {},
    "max-autotune-no-cudagraphs": {"max_autotune": True, "coordinate_descent_tuning": True},
    "max-autotune": {"max_autotune": True, "coordinate_descent_tuning": True},
}

_OWN_OPTIONS = ("fallback_execution", "allow_cpu_inputs")


class NeuronCompileError(RuntimeError):
    """A graph could not be compiled for ``neuron``."""


def _graph_label(gm: torch.fx.GraphModule) -> str:
    ops = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    first = ops[0].format_node() if ops else "<no operators>"
    return f"graph {getattr(gm, '_neuron_graph_id', '?')} ({len(ops)} operators; first: {first})"


def _check_inputs(gm: torch.fx.GraphModule, example_inputs, allow_cpu: bool) -> None:
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    on_neuron = any(t.device.type == "neuron" for t in tensors)
    if not on_neuron or allow_cpu:
        return
    bad = [(i, t) for i, t in enumerate(example_inputs)
           if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dim() > 0]
    if bad:
        i, t = bad[0]
        raise NeuronCompileError(
            f"torch.compile(backend='neuron'): input {i} of {_graph_label(gm)} is a CPU tensor "
            f"{tuple(t.shape)} {t.dtype} while the graph's other tensors are on neuron. Move it with "
            f".to('neuron'), or pass options={{'allow_cpu_inputs': True}} to compile the mixed graph "
            f"(its CPU parts then run on the host).")


def _passed_to_dynamo() -> tuple:
    """What a backend must let through to Dynamo, as Inductor's own backend does: Dynamo's requests
    to restart the analysis of a frame (with a Python scalar made a tensor, for one) or to skip it,
    its shortened tracebacks, and IndexError, which Dynamo gives to the user unchanged (a dimension
    out of range raises IndexError with every backend)."""
    from torch._dynamo import exc

    return (exc.RestartAnalysis, exc.SkipFrame, exc.ShortenTraceback, IndexError)


_PASSED_TO_DYNAMO = _passed_to_dynamo()

_graph_ids = iter(range(1, 1 << 62))

#: counters: "graphs" (graphs handed to the backend), "fallbacks" (graphs run eagerly)
stats: collections.Counter = collections.Counter()


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, mode: str | None = None,
                   options: dict[str, Any] | None = None):
    from torch._inductor.compile_fx import compile_fx

    from . import register

    register()
    gm._neuron_graph_id = next(_graph_ids)
    stats["graphs"] += 1
    options = dict(options or {})
    fallback = bool(options.pop("fallback_execution", False))
    allow_cpu = bool(options.pop("allow_cpu_inputs", False))
    mode = mode or "default"
    if mode not in MODES:
        raise NeuronCompileError(f"torch.compile(backend='neuron'): unknown mode {mode!r}; "
                                 f"expected one of {', '.join(MODES)}")
    config_patches = {**MODES[mode], **options}
    _check_inputs(gm, example_inputs, allow_cpu)
    try:
        if mode == "reduce-overhead":
            return _compile_for_replay(gm, example_inputs, config_patches)
        return compile_fx(gm, example_inputs, config_patches=config_patches)
    except _PASSED_TO_DYNAMO:
        raise
    except Exception as e:
        label = _graph_label(gm)
        if fallback:
            stats["fallbacks"] += 1
            warnings.warn(f"torch.compile(backend='neuron') could not compile {label}: "
                          f"{type(e).__name__}: {e}; running it eagerly (fallback_execution=True)")
            return gm.forward
        raise NeuronCompileError(f"torch.compile(backend='neuron') failed to compile {label}: "
                                 f"{type(e).__name__}: {e}") from e


def _compile_for_replay(gm, example_inputs, config_patches):
    """compile_fx with Inductor's inner compiler wrapped (replay.py). A hit in
    AOTAutograd's cache would return graphs without calling the inner
    compiler, so that cache is off here; Inductor's FX graph cache (the
    generated code) still serves."""
    from torch._functorch import config as functorch_config
    from torch._inductor.compile_fx import compile_fx

    from .replay import inner_compile

    with functorch_config.patch(enable_autograd_cache=False):
        return compile_fx(gm, example_inputs, inner_compile=inner_compile(_graph_label(gm)),
                          config_patches=config_patches)
