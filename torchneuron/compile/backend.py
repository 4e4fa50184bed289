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
  with a warning, instead of raising; its default follows
  ``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION``), ``allow_cpu_inputs`` (bool:
  compile a graph with CPU inputs as it is, its CPU parts on the host) and
  ``model_name`` (str: the name in the compilation metrics, metrics.py).
* CPU inputs are copied to the device (inputs.py), as TorchNeuron does.
"""
from __future__ import annotations

import collections
import warnings
from typing import Any

import torch

from .. import environment, target
from . import inputs, metrics
from .replay import inner_compile
from .registration import register

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


class NeuronCompileError(RuntimeError):
    """A graph could not be compiled for ``neuron``."""


def _graph_label(gm: torch.fx.GraphModule) -> str:
    ops = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    first = ops[0].format_node() if ops else "<no operators>"
    return f"graph {getattr(gm, '_neuron_graph_id', '?')} ({len(ops)} operators; first: {first})"


def _refuse_cpu_input(gm: torch.fx.GraphModule, example_inputs, i: int) -> None:
    t = example_inputs[i]
    raise NeuronCompileError(
        f"torch.compile(backend='neuron'): input {i} of {_graph_label(gm)} is a CPU tensor "
        f"{tuple(t.shape)} {t.dtype} and TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY is on. Move it with "
        f".to('neuron'), unset the variable to have it copied, or pass options={{'allow_cpu_inputs': True}} "
        f"to compile the graph as it is (its CPU parts then run on the host).")


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


def _as_on_target(mode: str) -> str:
    """The Trainium twin (torchneuron.target) holds the backend to TorchNeuron's options:
    ``dynamic=True`` is refused at compilation, and a mode other than "default" is
    ignored with a warning (AWS's torch.compile backend reference)."""
    twin = target.active()
    if twin is None:
        return mode
    if not torch._dynamo.config.assume_static_by_default:
        raise NeuronCompileError(f"torch.compile(backend='neuron'): dynamic=True is not supported on "
                                 f"{twin.core.key} (TORCHNEURON_TARGET): each new shape compiles its own graph; "
                                 f"leave dynamic unset")
    if mode != "default":
        warnings.warn(f"torch.compile(backend='neuron', mode={mode!r}): {twin.core.key} supports only the default "
                      f"mode and compiles this graph with it (TORCHNEURON_TARGET)", target.TargetWarning)
    return "default"


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, mode: str | None = None,
                   options: dict[str, Any] | None = None):
    from torch._inductor.compile_fx import compile_fx

    register()
    gm._neuron_graph_id = next(_graph_ids)
    stats["graphs"] += 1
    options = dict(options or {})
    fallback = bool(options.pop("fallback_execution",
                                not environment.flag("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION")))
    allow_cpu = bool(options.pop("allow_cpu_inputs", False))
    model_name = str(options.pop("model_name", None) or metrics.get_model_name())
    mode = _as_on_target(mode or "default")
    if mode not in MODES:
        raise NeuronCompileError(f"torch.compile(backend='neuron'): unknown mode {mode!r}; "
                                 f"expected one of {', '.join(MODES)}")
    config_patches = {**MODES[mode], **options}
    moved = [] if allow_cpu else inputs.cpu_inputs(example_inputs)
    if moved and environment.flag("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY"):
        _refuse_cpu_input(gm, example_inputs, moved[0])
    device = torch.device("neuron", torch.neuron.current_device())
    to_host = bool(moved) and environment.flag("TORCH_NEURONX_RETAIN_DEVICE_MODE") and all(
        t.device.type == "cpu" for t in example_inputs if isinstance(t, torch.Tensor))
    example_inputs = inputs.to_device(example_inputs, moved, device)
    try:
        compiled = _compile(gm, example_inputs, mode, config_patches, model_name)
        return inputs.copying(compiled, moved, device, to_host) if moved else compiled
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


def _compile(gm, example_inputs, mode: str, config_patches: dict, model_name: str):
    """compile_fx with Inductor's inner compiler wrapped to record each graph's
    metrics and, for "reduce-overhead", to record and replay it (replay.py). A hit
    in AOTAutograd's cache returns graphs without calling the inner compiler:
    such graphs are recorded as loaded, and for replay that cache is off
    (Inductor's FX graph cache, the generated code, still serves)."""
    from torch._dynamo.utils import counters
    from torch._functorch import config as functorch_config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    inner = compile_fx_inner
    replaying = mode == "reduce-overhead"
    if replaying:
        inner = inner_compile(_graph_label(gm))
    loaded = counters["inductor"]["fxgraph_cache_hit"]
    hits = counters["aot_autograd"]["autograd_cache_hit"]
    # The twin (torchneuron.target) charges graphs as the inner compiler returns them, which
    # AOTAutograd's cache would skip.
    cache = not replaying and target.active() is None and functorch_config.enable_autograd_cache
    with functorch_config.patch(enable_autograd_cache=cache):
        compiled = compile_fx(gm, example_inputs, inner_compile=metrics.recording(inner, model_name),
                              config_patches=config_patches)
    if counters["aot_autograd"]["autograd_cache_hit"] > hits:
        metrics.record_cache_hits(gm, model_name, counters["inductor"]["fxgraph_cache_hit"] - loaded)
    return compiled
