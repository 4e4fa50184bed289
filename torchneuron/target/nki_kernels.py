"""NKI kernels on the target: each launch charged the NKI performance model's latency.

A kernel launched on ``neuron`` tensors is one device task that the dispatch
mode never sees (torchneuron/nki/torch_bridge.py queues it directly). The twin
observes the launch instead, and charges the kernel what the emulator's
instruction-level performance model (torchneuron/nki/perf.py, ``nki.estimate``)
gives for that signature on the target's machine model: the kernel is run
once per signature on zero-filled inputs with its instructions recorded.
"""
from __future__ import annotations

from . import figures
from .roofline import OpCost

_ENGINE_OF = {"tensor": "tensor", "vector": "vector", "scalar": "scalar", "gpsimd": "gpsimd", "dma": "hbm"}


def observer(twin):
    """The launch observer torch_bridge calls for ``twin``."""
    from ..nki import perf, torch_bridge
    from ..nki.machine import resolve_machine

    machine = resolve_machine(twin.core.key)
    costs = {}

    def charge(kernel, grid, args_t, kwargs_t, tensors):
        with twin.launching():
            _charge(kernel, grid, args_t, kwargs_t, tensors)

    def _charge(kernel, grid, args_t, kwargs_t, tensors):
        key = (kernel.fn, tuple(grid), repr(args_t), repr(sorted(kwargs_t.items())),
               tuple((tuple(t.shape), t.dtype) for t in tensors))
        cost = costs.get(key)
        if cost is None:
            args, kwargs = torch_bridge.arguments(args_t, kwargs_t, torch_bridge.zero_inputs(tensors))
            _, records, _, _ = perf.run_profiled(kernel[grid] if grid else kernel, args, kwargs, target=machine)
            rep = perf.model(records, machine, kernel.fn.__name__)
            cost = OpCost(flops=int(rep.flops), bytes=int(rep.hbm_bytes), launch_s=twin.core.launch_s)
            for engine, e in rep.engines.items():
                cost.engine_s[_ENGINE_OF.get(engine, engine)] = e["busy_ns"] * 1e-9
            # The kernel's latency is its critical path, not its busiest engine's time: the
            # ledger charges the busiest engine, so that one carries the whole latency.
            cost.engine_s[cost.engine] = rep.latency_ns * 1e-9
            costs[key] = cost
            twin.ledger.compiled(figures.EAGER_COMPILE_S, graph=False)  # a kernel's NEFF
        twin.charge(f"nki::{kernel.fn.__name__}", cost)

    return charge
