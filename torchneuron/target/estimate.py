"""The modelled time of a step the twin has not run here: traced from fake tensors.

A model too large for this host (a 70B Llama, say) can still be costed: built on
the ``meta`` device (shapes and dtypes, no memory), its step is traced twice,
and each trace is costed by the twin's roofline (``roofline.py``) on a logical
core of the target:

* **eager:** ``make_fx`` under a fake-tensor mode records the ATen operators the
  step dispatches after autograd, the ones TorchNeuron's eager mode launches;
  each is charged as one launch (``op_cost``), as the twin charges them live;
* **compiled:** ``torch.compile`` runs the step through Inductor's own
  front end (Dynamo, AOTAutograd with Inductor's decompositions and its
  partitioner), as ``backend="neuron"`` does, and each graph Inductor would
  compile is charged as one launch (``graph_cost``), as the twin charges it
  live. Operators run between graphs (the gradient seed, an optimizer) are
  not counted.

A transformer's layers are alike, so a deep model is costed from one- and
two-layer builds of it, extrapolated (:func:`estimate_layers`): every cost
here is a sum over operators or over graphs, linear in the layer count, and
tracing two layers is far cheaper than tracing eighty.

Every figure is modelled, with the twin's assumptions (``figures.ASSUMED``). One
rank's step of a sharded model runs no collectives here, so none are charged:
the communication between ranks is left out. ``benchmarks/target_calibration.py``
compares such estimates with AWS's published measurements.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Callable

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_leaves

from . import eager_fusion, figures
from .figures import LogicalCore
from .roofline import OpCost, graph_cost, op_cost


@dataclass
class Estimate:
    """The modelled cost of one step on one logical core (seconds, FLOPs)."""

    eager_s: float            # each operator launched as the live twin charges it
    eager_launches: int
    compiled_s: float         # each compiled graph one launch
    graphs: list = field(default_factory=list)  # OpCost of each compiled graph, in compile order
    flops: int = 0            # matrix FLOPs of the step (the eager trace's)
    compiled_flops: int = 0   # the same, counted in the compiled graphs

    def extrapolate(self, two: "Estimate", layers: int) -> "Estimate":
        """``self`` is the step with one layer, ``two`` with two: the step with ``layers``."""
        def at(a, b):
            return a + (layers - 1) * (b - a)
        return Estimate(eager_s=at(self.eager_s, two.eager_s),
                        eager_launches=round(at(self.eager_launches, two.eager_launches)),
                        compiled_s=at(self.compiled_s, two.compiled_s),
                        graphs=[_extrapolate_cost(a, b, layers) for a, b in zip(self.graphs, two.graphs)],
                        flops=round(at(self.flops, two.flops)),
                        compiled_flops=round(at(self.compiled_flops, two.compiled_flops)))


def _extrapolate_cost(a: OpCost, b: OpCost, layers: int) -> OpCost:
    def at(x, y):
        return x + (layers - 1) * (y - x)
    return replace(a, flops=round(at(a.flops, b.flops)), elements=round(at(a.elements, b.elements)),
                   bytes=round(at(a.bytes, b.bytes)),
                   engine_s={e: at(a.engine_s.get(e, 0.0), b.engine_s.get(e, 0.0))
                             for e in set(a.engine_s) | set(b.engine_s)})


def _step(model: torch.nn.Module, kwargs: dict, backward: bool) -> Callable[[], object]:
    params = [p for p in model.parameters() if p.requires_grad]
    # A copy per trace: a step may update its arguments (a KV cache grows by one position),
    # and a trace leaves its own fake tensors in what it updates.
    kwargs = copy.deepcopy(kwargs)

    def step():
        # Without gradients an inference step is traced as one, as under torch.no_grad()
        # (a compiled graph that saved activations for a backward would return them too).
        with torch.set_grad_enabled(backward):
            out = model(**kwargs)
        if backward:
            loss = out.loss if hasattr(out, "loss") else out
            # autograd.grad rather than backward(): no gradient is accumulated into .grad,
            # so tracing the step twice does not add the accumulation to the second trace.
            return torch.autograd.grad(loss, params)
        # The result's tensors only (a model output may also carry a cache object).
        return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]

    return step


def eager_cost(model: torch.nn.Module, kwargs: dict, core: LogicalCore, *, backward: bool = False):
    """(seconds, launches, FLOPs) of the step in eager mode: the operators make_fx records
    under a fake-tensor mode, each charged as the live twin charges it (a launch of its
    own, or joined to the one before it: ``eager_fusion.py``)."""
    gm = make_fx(_step(model, kwargs, backward), tracing_mode="fake", _allow_non_fake_inputs=True)()
    seconds, launches, flops = 0.0, 0, 0
    eager_fusion.end_run()
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        args, kw = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
        out = node.meta.get("val")
        cost = op_cost(node.target, args, kw, out, core)
        if cost is not None:
            tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            cost, joined = eager_fusion.join(cost, tree_leaves((args, kw)), tensors, core)
            seconds += cost.seconds
            launches += not joined
            flops += cost.flops
    eager_fusion.end_run()
    return seconds, launches, flops


def compiled_graphs(model: torch.nn.Module, kwargs: dict, *, backward: bool = False) -> list:
    """The FX graphs Inductor would compile for the step (forward and backward, or one
    inference graph), as ``torch.compile(backend="neuron")`` hands them to its compiler."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    graphs = []

    def keep(gm, example_inputs, *args, **kwargs):
        graphs.append(gm)

        def run(inputs):
            return gm(*inputs)

        run._boxed_call = True
        return run

    def backend(gm, example_inputs):
        # Constant folding of uniform values breaks the order of a graph of meta tensors. It
        # only moves constant fills (a loss's zeros) from the graph into its inputs, so it is
        # off here: the graphs' costs differ from the live twin's by those fills' traffic.
        with inductor_config.patch(joint_graph_constant_folding=False):
            return compile_fx(gm, example_inputs, inner_compile=keep)

    # Each estimate compiles a different model: Dynamo's cache of earlier ones would guard
    # against them and count towards its recompile limit.
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=False)
    try:
        _step(compiled, kwargs, backward)()
    finally:
        torch._dynamo.reset()
    return graphs


def estimate(model: torch.nn.Module, kwargs: dict, *, backward: bool = False, target: str = "trn2",
             lnc: int = 2, core: LogicalCore | None = None, compiled: bool = True) -> Estimate:
    """The modelled step ``model(**kwargs)`` (and, with ``backward``, the gradients of its
    loss with respect to its parameters) on one logical core of ``target``. The model and
    the tensors in ``kwargs`` are best on the ``meta`` device: nothing is computed."""
    core = core or figures.logical_core(target, lnc)
    eager_s, launches, flops = eager_cost(model, kwargs, core, backward=backward)
    graphs = [graph_cost(gm, core) for gm in compiled_graphs(model, kwargs, backward=backward)] if compiled else []
    return Estimate(eager_s=eager_s, eager_launches=launches, compiled_s=sum(g.seconds for g in graphs),
                    graphs=graphs, flops=flops, compiled_flops=sum(g.flops for g in graphs))


def estimate_layers(build: Callable[[int], tuple], layers: int, **options) -> Estimate:
    """The step of a model of ``layers`` alike layers, from builds of one and two layers:
    ``build(n)`` returns ``(model, kwargs)`` for ``n`` layers. Options as :func:`estimate`."""
    one = estimate(*build(1), **options)
    if layers == 1:
        return one
    return one.extrapolate(estimate(*build(2), **options), layers)
