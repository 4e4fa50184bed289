"""The modelled duration of one operator on a target's logical core: a roofline.

An operator's work is split by where Trainium does it: matrix products on the
TensorEngine (FLOPs from PyTorch's own formulas, ``torch.utils.flop_counter``),
transcendental element-wise functions on the ScalarEngine (its activation
unit), data-dependent indexing, sorting and scans on the GpSimd engine, the
rest of element-wise and reduction work on the VectorEngine, every byte read
or written through HBM, and a collective's traffic over NeuronLink (a ring,
at the logical core's share of its chip's links, after a fixed latency). The engines and the memory work at once, so the
duration is the slowest of them, plus the per-launch cost of an eager
operator. 64-bit values count 4 bytes, as the target stores them
(``rules.py``). Views move nothing and cost nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten

from .figures import LogicalCore

# Collectives, by the fraction of a ring's traffic each rank sends of the bytes named:
# (n - 1) / n of the gathered or scattered whole, twice that for an all-reduce.
_RING = {
    "allreduce_": 2, "all_reduce": 2, "all_reduce_": 2, "all_reduce_coalesced": 2, "allreduce_coalesced_": 2,
    "allgather_": 1, "_allgather_base_": 1, "allgather_into_tensor_coalesced_": 1, "all_gather_into_tensor": 1,
    "all_gather_into_tensor_coalesced": 1, "reduce_scatter_": 1, "_reduce_scatter_base_": 1,
    "reduce_scatter_tensor": 1, "reduce_scatter_tensor_coalesced": 1, "alltoall_": 1, "alltoall_base_": 1,
    "all_to_all_single": 1, "broadcast_": 0, "broadcast": 0,
}

# The ScalarEngine's activation functions (element-wise, one pass per element).
_SCALAR_OPS = frozenset("""
exp exp2 expm1 log log2 log10 log1p tanh sigmoid gelu silu mish erf erfc erfinv sin cos tan
asin acos atan sinh cosh asinh acosh atanh sqrt rsqrt reciprocal pow softplus elu selu celu
_softmax _log_softmax softmax log_softmax logit hardswish hardsigmoid
gelu_backward silu_backward tanh_backward sigmoid_backward _softmax_backward_data
_log_softmax_backward_data elu_backward softplus_backward mish_backward
""".split())
# Data-dependent or cross-partition work: the GpSimd engine.
_GPSIMD_OPS = frozenset("""
index index_put index_put_ _index_put_impl_ index_select index_add index_add_ index_copy index_copy_
index_fill index_fill_ gather scatter scatter_ scatter_add scatter_add_ scatter_reduce scatter_reduce_
embedding embedding_dense_backward sort topk argsort cumsum cumprod cummax cummin nonzero masked_select
masked_scatter masked_scatter_ unique _unique2 unique_consecutive searchsorted bucketize kthvalue median
mode multinomial randperm take put_ histc bincount
""".split())
# Gathers from a larger source: charged by what they pick (op_cost).
_GATHER_OPS = frozenset("embedding index index_select gather take".split())
# Pure data movement: HBM traffic only.
_MOVE_OPS = frozenset("""
copy_ _to_copy clone contiguous cat stack new_empty_strided empty_strided empty
fill_ zero_ zeros ones full zeros_like ones_like full_like empty_like constant_pad_nd
""".split())

# Metadata only: launch nothing on the target.
_FREE_OPS = frozenset("detach lift_fresh alias _local_scalar_dense _unsafe_view _reshape_alias set_ resize_".split())


def bound_of(engine: str) -> str:
    return {"hbm": "memory", "link": "collective"}.get(engine, "compute")


def _flash_attention_flops(q, k, v, *args, **kwargs) -> int:
    # q: (B, H, L, E), k: (B, H, S, E), v: (B, H, S, Ev): two matrix products.
    b, h, l_, e = q.shape
    s, ev = k.shape[-2], v.shape[-1]
    return 2 * b * h * l_ * s * (e + ev)


def _matmul_flops(func, args, kwargs, out) -> int:
    from torch.utils.flop_counter import flop_registry

    packet = func._overloadpacket
    name = packet.__name__
    if packet in flop_registry:
        try:
            return int(flop_registry[packet](*args, **kwargs, out_val=out))
        except Exception:  # noqa: BLE001  (an argument form the formula does not know: counted as no matmul)
            return 0
    if name == "_scaled_dot_product_flash_attention_for_cpu":
        return _flash_attention_flops(*args[:3])
    if name == "_scaled_dot_product_flash_attention_for_cpu_backward":
        # grad_out, q, k, v, ...: the forward's two products again and three more
        return _flash_attention_flops(*args[1:4]) * 5 // 2
    return 0


def _dtype_class(dtype: torch.dtype) -> str:
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2, getattr(torch, "float8_e4m3fnuz", None)):
        return "fp8"
    if dtype in (torch.bfloat16, torch.float16):
        return "bf16"
    return "fp32"


def target_itemsize(dtype: torch.dtype) -> int:
    """Bytes per element on the target: 64-bit types are stored in 32 bits."""
    size = dtype.itemsize
    return 4 if size == 8 and not dtype.is_complex else size


@dataclass
class OpCost:
    """One operator's modelled work and duration (seconds)."""

    flops: int = 0
    elements: int = 0
    bytes: int = 0
    engine_s: dict = field(default_factory=dict)  # engine -> seconds
    launch_s: float = 0.0

    @property
    def busy_s(self) -> float:
        return max(self.engine_s.values(), default=0.0)

    @property
    def seconds(self) -> float:
        return self.busy_s + self.launch_s

    @property
    def bound(self) -> str:
        """What limits it: "launch", "memory" (HBM), "collective" (NeuronLink) or "compute" (an engine)."""
        if self.launch_s >= self.busy_s:
            return "launch"
        return bound_of(self.engine)

    @property
    def engine(self) -> str:
        """The engine (or "hbm") that takes longest."""
        return max(self.engine_s, key=self.engine_s.get) if self.engine_s else "hbm"


def _tensors(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def storage_identity(t: torch.Tensor):
    # The same memory read twice (an in-place operator's argument and result) moves once.
    try:
        return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
    except (RuntimeError, NotImplementedError):  # fake tensors of a traced graph have no memory
        return id(t)


def _world_size(args) -> int:
    import torch.distributed as dist

    for a in args:
        if hasattr(a, "size") and type(a).__name__ in ("ProcessGroup", "ScriptObject"):
            try:
                return int(a.size())
            except Exception:  # noqa: BLE001  (a script object without size(): the default group's)
                break
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def ring_seconds(ring_factor: float, nbytes: int, ranks: int, core: LogicalCore) -> float:
    """A collective's traffic over NeuronLink: each rank sends ``ring_factor`` (n - 1) / n
    of ``nbytes`` at its share of the links (the whole once for a broadcast)."""
    factor = ring_factor * (ranks - 1) / ranks if ring_factor else 1.0
    return factor * nbytes / core.link_bytes_per_s


def collective_seconds(ring_factor: float, nbytes: int, ranks: int, core: LogicalCore) -> float:
    """One collective: its latency and its traffic (``ring_seconds``); nothing on one rank."""
    if ranks <= 1:
        return 0.0
    return core.collective_latency_s + ring_seconds(ring_factor, nbytes, ranks, core)


def collective_cost(name: str, args, tensors, core: LogicalCore) -> OpCost:
    """A ring collective over the chips' NeuronLink (``collective_seconds``)."""
    whole = max((sum(t.numel() * target_itemsize(t.dtype) for t in group) for group in tensors), default=0)
    cost = OpCost(bytes=int(whole), launch_s=core.launch_s)
    cost.engine_s["link"] = collective_seconds(_RING[name], whole, _world_size(args), core)
    return cost


def op_cost(func, args, kwargs, out, core: LogicalCore, *, launch: bool = True) -> OpCost | None:
    """The modelled cost of ``func(*args, **kwargs) -> out`` on ``core``; None for a view
    or metadata operator, which launches nothing on the target."""
    if func.is_view or func._overloadpacket.__name__ in _FREE_OPS:
        return None
    name = func._overloadpacket.__name__
    ins, outs = _tensors((args, kwargs)), _tensors(out)
    if name in _RING and func.namespace in ("c10d", "_c10d_functional"):
        # In-place collectives take their outputs as arguments: the whole is the largest argument.
        return collective_cost(name, args, [_tensors(a) for a in args] + [outs], core)
    if name in _GATHER_OPS and outs:
        # A gather reads the rows it picks, not its whole source: its work and traffic are
        # its result's (read once, written once) and its indices'.
        moved = outs + [t for t in ins if not t.is_floating_point() and t.dtype != torch.bool]
        nbytes = sum(t.numel() * target_itemsize(t.dtype) for t in moved) + sum(
            t.numel() * target_itemsize(t.dtype) for t in outs)
        elements = max(t.numel() for t in outs)
    else:
        seen, nbytes = set(), 0
        for t in ins + outs:
            key = storage_identity(t)
            if key not in seen:
                seen.add(key)
                nbytes += t.numel() * target_itemsize(t.dtype)
        elements = max([t.numel() for t in ins + outs], default=0)
    cost = OpCost(bytes=nbytes, elements=elements)
    cost.engine_s["hbm"] = nbytes / core.hbm_bytes_per_s
    flops = _matmul_flops(func, args, kwargs, out)
    if flops:
        ref = ins[0] if ins else outs[0]
        cost.flops = flops
        cost.engine_s["tensor"] = flops / core.tensor_flops_per_s(_dtype_class(ref.dtype))
    elif name not in _MOVE_OPS and elements:
        engine = "scalar" if name in _SCALAR_OPS else "gpsimd" if name in _GPSIMD_OPS else "vector"
        two_byte = bool(outs) and outs[0].dtype.itemsize == 2
        cost.engine_s[engine] = elements / core.engine_elements_per_s(engine, two_byte)
    if launch:
        cost.launch_s = core.launch_s
    return cost


def graph_cost(gm: torch.fx.GraphModule, core: LogicalCore) -> OpCost:
    """The modelled cost of one launch of a compiled graph: each node's engine work
    (from its fake values), HBM traffic only for the graph's inputs and outputs (the
    compiler keeps intermediates on chip where it fuses them), one launch."""
    total = OpCost(launch_s=core.launch_s)
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        val = node.meta.get("val")
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
        try:
            c = op_cost(node.target, args, kwargs, val, core, launch=False)
        except Exception:  # noqa: BLE001  (a node whose fake values the formulas cannot read)
            continue
        if c is None:
            continue
        total.flops += c.flops
        total.elements += c.elements
        for engine, s in c.engine_s.items():
            if engine != "hbm":
                total.engine_s[engine] = total.engine_s.get(engine, 0.0) + s
    boundary = 0
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            for v in _tensors(node.meta.get("val") if node.op == "placeholder" else
                              torch.fx.node.map_arg(node.args, lambda n: n.meta.get("val"))):
                boundary += v.numel() * target_itemsize(v.dtype)
    total.bytes = boundary
    total.engine_s["hbm"] = boundary / core.hbm_bytes_per_s
    return total

