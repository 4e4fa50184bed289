"""Every change torchneuron makes to PyTorch's Python internals, in one place.

Each patch has a name, says what it changes and why, and has a check that its
target still exists and behaves as the patch assumes. :func:`apply` runs the
check (once per process) before making the change, and :func:`check` runs it
alone, so after a PyTorch upgrade a moved or changed target fails with a
:class:`TorchPatchError` naming the patch instead of changing Inductor's
behaviour quietly. Written and checked against PyTorch 2.13.0
(:data:`CHECKED_AGAINST`).

======================================  =================================================
patch                                   target
======================================  =================================================
``inductor-is-cpu``                     ``torch._inductor.scheduler.BaseSchedulerNode.is_cpu``
                                        and ``torch._inductor.ir.is_cpu``
``inductor-current-backend``            ``torch._inductor.utils.get_current_backend`` and
                                        every ``torch._inductor`` module holding it
``inductor-argreduce-logical-index``    ``torch._inductor.lowering._make_reduction_inner``, for
                                        neuron inputs
``inductor-pointwise-device``           ``torch._inductor.lowering.is_gpu``, as read by
                                        ``make_pointwise``
``inductor-scatter-fallback``           ``torch._inductor.utils.use_scatter_fallback``, in the
                                        modules that imported it (lowering, decomposition)
``inductor-wrapper-overrides``          (checked only) the ``PythonWrapperCodegen`` methods,
                                        one of them private, that our wrapper overrides
``inductor-compiled-callable``          ``CompiledFxGraph.current_callable`` of each graph
                                        compiled for ``mode="reduce-overhead"``
``nki-kernel-dynamo-disable``           ``torchneuron.nki.Kernel.__call__`` (our own class),
                                        wrapped in ``torch.compiler.disable``
``set-num-threads``                     ``torch.set_num_threads``, which also tells the
                                        device the count
``c10d-default-backend``                ``torch.distributed.distributed_c10d._new_process_group_helper``:
                                        a group with the neuron backend has it as default
``mp-neuron-storage``                   ``torch.multiprocessing``'s reducer of ``torch.UntypedStorage``
                                        in ``ForkingPickler``: neuron storages are shared
``c10d-monitored-barrier``              ``torch.distributed.monitored_barrier``, for groups
                                        with the neuron backend
``fake-conv-layout``                    ``torch._subclasses.fake_impls``' convolution and
                                        convolution_backward, for neuron inputs
``inductor-layout-opt``                 ``torch._inductor.graph.SUPPORTED_MKLDNN_DEVICES``,
                                        as read by ``decide_layout_opt``
``inductor-conv-bias``                  ``torch._inductor.kernel.conv.convolution`` (the lowering of
                                        ``aten.convolution``), for neuron inputs
``flex-device``                         ``torch.nn.attention.flex_attention._validate_device``,
                                        for neuron inputs
``inductor-flex-cpu-template``          the lowering of ``higher_order.flex_attention``: neuron goes
                                        to the CPU's C++ template (``lower_cpu``)
``inductor-flex-dense``                 ``torch._inductor.fx_passes.post_grad.post_grad_passes`` (and
                                        compile_fx's name for it): neuron flex with its logsumexp, and
                                        its backward, decomposed first
``nn-parallel-comm``                    ``torch.nn.parallel.comm``'s broadcast, broadcast_coalesced,
                                        scatter and gather, for neuron tensors (nn.DataParallel)
======================================  =================================================

Not patches, and so not here: what torchneuron registers through PyTorch's
extension points, next to the thing it registers.

* the device: ``torch.utils.rename_privateuse1_backend``,
  ``torch._register_device_module``,
  ``torch.utils.generate_methods_for_privateuse1_backend`` (_registration.py);
  operators through ``torch.library`` (_python_tasks.py, nki_op);
* Dynamo: ``torch._dynamo.register_backend`` (compile/__init__.py),
  ``register_interface_for_device`` and the compile workers' caches of a device
  interface (compile/device_interface.py);
* Inductor: ``register_backend_for_device`` (with the device's code-generation
  config, compile/codegen_config.py) and ``register_device_op_overrides``
  (compile/inductor_device.py), run when Inductor first asks the device module
  for its code generators (``torch.neuron.Scheduling``, neuron/__init__.py);
  ``torch._functorch.config.patch``, a scoped config change (compile/backend.py);
* custom operators: ``torch.library.register_kernel`` for ``torch.nn.attention.varlen``'s
  operators on neuron (varlen.py).

Not a patch either: ``torchneuron-lockin run`` (torchneuron/lockin/redirect.py)
redirects ``torch.cuda``, ``torch.autocast``, ``torch.amp.GradScaler`` and
``init_process_group`` for the program it runs, opt-in, inside a context
manager that puts each back on exit.

Not PyTorch: ``torchneuron.nki.install_import_aliases()``
(torchneuron/nki/import_names.py) enters the NKI emulator in ``sys.modules``
under the upstream import names ``neuronxcc.nki`` and ``nki``, on request.
The C++ bridge's changes to PyTorch are in csrc/bridge/torch_patches.h.
"""
from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import _C, parallel_comm, sharing

#: the PyTorch version every check below was written against
CHECKED_AGAINST = "2.13.0"

# a patched function keeps the function it replaced under this attribute:
# it marks the patch as applied and lets the check look at PyTorch's original
_ORIGINAL = "_torchneuron_original"


class TorchPatchError(RuntimeError):
    """A patch's target is missing or no longer behaves as the patch assumes."""


@dataclass(frozen=True)
class Patch:
    name: str
    target: str      # what it changes
    why: str
    check: Callable[[], None]                 # raises TorchPatchError
    apply: Callable[..., Any] | None = None   # None: a dependency that is only checked


PATCHES: dict[str, Patch] = {}
_checked: set[str] = set()


def check(name: str) -> None:
    """Runs patch ``name``'s check; raises :class:`TorchPatchError` if it fails."""
    PATCHES[name].check()
    _checked.add(name)


def apply(name: str, *args: Any) -> Any:
    """Checks patch ``name`` (the first time) and applies it (idempotent)."""
    if name not in _checked:
        check(name)
    patch = PATCHES[name]
    return patch.apply(*args) if patch.apply is not None else None


def _register(name: str, *, target: str, why: str, check: Callable[[], None],
              apply: Callable[..., Any] | None = None) -> None:
    PATCHES[name] = Patch(name, target, why, check, apply)


def _fail(name: str, problem: str) -> None:
    raise TorchPatchError(f"patch {name!r}: {problem} (checked against PyTorch {CHECKED_AGAINST}; "
                          f"this is {torch.__version__}). See torchneuron/_torch_patches.py.")


def _module(name: str, dotted: str):
    """The PyTorch module ``dotted``, imported."""
    try:
        return importlib.import_module(dotted)
    except ImportError as e:
        _fail(name, f"{dotted} no longer imports ({e})")


def _original(fn):
    return getattr(fn, _ORIGINAL, fn)


def _replace(owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
    """Sets ``owner.attr`` to ``make(original)``, marked with the original, unless already replaced."""
    original = getattr(owner, attr)
    if hasattr(original, _ORIGINAL):
        return
    replacement = make(original)
    setattr(replacement, _ORIGINAL, original)
    setattr(owner, attr, replacement)


def _require(name: str, owner: Any, attr: str, where: str):
    """``owner.attr``, as PyTorch defined it (before our patch, if applied)."""
    fn = getattr(owner, attr, None)
    if not callable(fn):
        _fail(name, f"{where}.{attr} no longer exists")
    return _original(fn)


def _source(name: str, obj, where: str) -> str:
    """The Python source of ``obj`` (a function or module), which the check reads."""
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        _fail(name, f"{where} no longer has Python source")


def _require_params(name: str, fn, where: str, params: tuple[str, ...]) -> None:
    """``fn`` takes ``params``, in this order (other parameters may follow or sit between)."""
    try:
        have = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        _fail(name, f"{where} has no inspectable signature")
    positions = [have.index(p) if p in have else -1 for p in params]
    if -1 in positions or positions != sorted(positions):
        _fail(name, f"{where} takes ({', '.join(have)}), expected ({', '.join(params)}) among them")


# --------------------------------------------------------------------------- inductor-is-cpu

def _check_is_cpu() -> None:
    name = "inductor-is-cpu"
    ir, scheduler = _module(name, "torch._inductor.ir"), _module(name, "torch._inductor.scheduler")

    node_cls = _require(name, scheduler, "BaseSchedulerNode", "torch._inductor.scheduler")
    method = _require(name, node_cls, "is_cpu", "torch._inductor.scheduler.BaseSchedulerNode")

    class Node:  # what the method reads of a node: its device
        def __init__(self, device):
            self.device = device

        def get_device(self):
            return self.device

    try:
        answers = [method(Node(torch.device(t))) for t in ("cpu", "meta")] + [method(Node(None))]
    except Exception as e:
        _fail(name, f"BaseSchedulerNode.is_cpu no longer answers from the node's get_device() ({e!r})")
    if answers != [True, False, False]:
        _fail(name, f"BaseSchedulerNode.is_cpu answers {answers} for devices cpu, meta, None")

    fn = _require(name, ir, "is_cpu", "torch._inductor.ir")
    get_device_type = _require(name, ir, "get_device_type", "torch._inductor.ir")
    if [fn(torch.device("cpu")), fn(torch.device("meta"))] != [True, False] \
            or get_device_type(torch.device("cpu")) != "cpu":
        _fail(name, "torch._inductor.ir.is_cpu / get_device_type no longer answer by the device type")


def _apply_is_cpu() -> None:
    from torch._inductor import ir, scheduler

    def is_cpu(self) -> bool:
        device = self.get_device()
        return device is not None and device.type in ("cpu", "neuron")

    _replace(scheduler.BaseSchedulerNode, "is_cpu", lambda original: is_cpu)
    # ir.is_cpu is called by name only inside ir.py: rebinding the module attribute reaches every caller
    _replace(ir, "is_cpu", lambda original: lambda x: ir.get_device_type(x) in ("cpu", "neuron"))


_register(
    "inductor-is-cpu",
    target="torch._inductor.scheduler.BaseSchedulerNode.is_cpu and torch._inductor.ir.is_cpu answer "
           "True for neuron",
    why="Inductor gates its C++-backend heuristics on 'is this node on the CPU?': loop reindexing and "
        "loop-order inversion in fusion, which assume SIMD (Triton) kernel groups, are skipped, and "
        "realisation thresholds are the CPU's. neuron's kernels are that C++ backend's, so neuron nodes "
        "answer as CPU nodes do. Nothing else in Inductor (allocation, mkldnn passes, GEMM templates) "
        "asks these two.",
    check=_check_is_cpu, apply=_apply_is_cpu)


# --------------------------------------------------------------------------- inductor-current-backend

def _check_current_backend() -> None:
    name = "inductor-current-backend"
    config, utils = _module(name, "torch._inductor.config"), _module(name, "torch._inductor.utils")

    fn = _require(name, utils, "get_current_backend", "torch._inductor.utils")
    _require_params(name, fn, "torch._inductor.utils.get_current_backend", ("device_type",))
    if fn("cpu") != config.cpu_backend:
        _fail(name, "get_current_backend('cpu') no longer answers config.cpu_backend")


def _holders(fn) -> list:
    """The loaded ``torch._inductor`` modules that hold ``fn`` as ``get_current_backend``."""
    return [m for key, m in list(sys.modules.items())
            if key.startswith("torch._inductor") and getattr(m, "__dict__", {}).get("get_current_backend") is fn]


def _apply_current_backend() -> None:
    from torch._inductor import config, utils
    from torch._inductor.virtualized import V

    original = utils.get_current_backend
    if hasattr(original, _ORIGINAL):
        return

    def get_current_backend(device_type: str | None = None) -> str:
        if not device_type:
            device_type = V.graph.get_current_device_or_throw().type
        if device_type == "neuron":
            return config.cpu_backend
        return original(device_type)

    setattr(get_current_backend, _ORIGINAL, original)
    for module in [utils] + [m for m in _holders(original) if m is not utils]:
        module.get_current_backend = get_current_backend


_register(
    "inductor-current-backend",
    target="torch._inductor.utils.get_current_backend answers config.cpu_backend for neuron, in every "
           "torch._inductor module that holds it",
    why="the code-generation backend Inductor names for a device: an unknown device type gets "
        "config.cuda_backend ('triton'), and code generation then takes Triton's paths (half-precision "
        "compute upcast, Triton-only checks) in C++ kernels. Modules that imported the function by name "
        "(codegen.common, scheduler, kernel.mm_common) are rebound too; modules imported later take it "
        "from utils, already rebound.",
    check=_check_current_backend, apply=_apply_current_backend)


# --------------------------------------------------------------------------- inductor-argreduce-logical-index

def _check_argreduce_logical_index() -> None:
    name = "inductor-argreduce-logical-index"
    lowering = _module(name, "torch._inductor.lowering")
    fn = _require(name, lowering, "_make_reduction_inner", "torch._inductor.lowering")
    _require_params(name, fn, "torch._inductor.lowering._make_reduction_inner", ("x",))
    _require(name, lowering, "is_triton", "torch._inductor.lowering")
    source = _source(name, fn, "torch._inductor.lowering._make_reduction_inner")
    if ("supports_logical_index_argreduce = is_triton(x) or (" not in source
            or 'ir.get_device_type(x) == "cpu" and config.cpu_backend == "cpp"' not in source):
        _fail(name, "_make_reduction_inner no longer decides by is_triton(x) or the CPU's C++ backend whether "
                    "argmax/argmin compute logical indices")
    if source.count("is_triton(") != 1:
        _fail(name, "_make_reduction_inner no longer asks is_triton exactly once (the patch answers that one)")


def _apply_argreduce_logical_index() -> None:
    from torch._inductor import ir, lowering

    def make(original):
        def _make_reduction_inner(x, *args, **kwargs):
            if ir.get_device_type(x) != "neuron":
                return original(x, *args, **kwargs)
            # Within this call is_triton answers one question (the check makes sure): whether the
            # backend computes logical indices. Lowering runs on one thread, the one compiling.
            is_triton = lowering.is_triton
            lowering.is_triton = lambda t: ir.get_device_type(t) == "neuron" or is_triton(t)
            try:
                return original(x, *args, **kwargs)
            finally:
                lowering.is_triton = is_triton
        return _make_reduction_inner

    _replace(lowering, "_make_reduction_inner", make)


_register(
    "inductor-argreduce-logical-index",
    target="torch._inductor.lowering._make_reduction_inner, whose is_triton answers True for neuron "
           "inputs during the call",
    why="argmax and argmin over several dimensions (or all) of a non-contiguous tensor must index it "
        "logically; Inductor computes those indices only for Triton and for the CPU's C++ backend, asking "
        "'is_triton(x) or (the device type is cpu and the backend cpp)'. neuron's kernels are that C++ "
        "backend's, so neuron inputs answer as CPU inputs do; otherwise the generated kernel returns the "
        "index in memory order (argmin of a channels_last tensor: 49 where eager says 22).",
    check=_check_argreduce_logical_index, apply=_apply_argreduce_logical_index)


# --------------------------------------------------------------------------- inductor-pointwise-device

def _check_pointwise_device() -> None:
    name = "inductor-pointwise-device"
    lowering, utils = _module(name, "torch._inductor.lowering"), _module(name, "torch._inductor.utils")
    if _original(getattr(lowering, "is_gpu", None)) is not getattr(utils, "is_gpu", None):
        _fail(name, "torch._inductor.lowering no longer holds torch._inductor.utils.is_gpu as is_gpu")
    make_pointwise = _require(name, lowering, "make_pointwise", "torch._inductor.lowering")
    module_source = _source(name, lowering, "torch._inductor.lowering")
    source = _source(name, make_pointwise, "torch._inductor.lowering.make_pointwise")
    if module_source.count("is_gpu(") != 1 or "if is_gpu(i.get_device().type):" not in source:
        _fail(name, "torch._inductor.lowering no longer asks is_gpu once, in make_pointwise, which input's "
                    "device a pointwise node runs on")


def _apply_pointwise_device() -> None:
    from torch._inductor import lowering

    _replace(lowering, "is_gpu", lambda is_gpu: lambda device: device == "neuron" or is_gpu(device))


_register(
    "inductor-pointwise-device",
    target="torch._inductor.lowering.is_gpu (the name lowering.py imported, read only by make_pointwise) "
           "answers True for neuron; torch._inductor.utils.is_gpu is unchanged",
    why="A pointwise node runs on its first GPU input's device, else on its first input's. Dynamo passes a "
        "Python scalar as a 0-dim CPU tensor, so in b + a with b that scalar and a on neuron the node, its "
        "output and its kernel went to the CPU: the kernel ran on the calling thread, reading device memory "
        "before the queued work that writes it had run (wrong values, silently), and the result was a CPU "
        "tensor where eager gives a neuron one. With neuron preferred as a GPU is, the node runs on neuron "
        "and reads the scalar as a GPU kernel does.",
    check=_check_pointwise_device, apply=_apply_pointwise_device)


# --------------------------------------------------------------------------- inductor-scatter-fallback

_SCATTER_FALLBACK_HOLDERS = ("torch._inductor.lowering", "torch._inductor.decomposition")


def _check_scatter_fallback() -> None:
    name = "inductor-scatter-fallback"
    utils = _module(name, "torch._inductor.utils")
    fn = _require(name, utils, "use_scatter_fallback", "torch._inductor.utils")
    _require_params(name, fn, "torch._inductor.utils.use_scatter_fallback", ("src_device_type",))
    source = _source(name, fn, "torch._inductor.utils.use_scatter_fallback")
    if 'src_device_type == "cpu"' not in source or "fallback_scatter_reduce_sum" not in source:
        _fail(name, "use_scatter_fallback no longer keeps the C++ backend's scatter_reduce sum fallback "
                    "(config.cpp.fallback_scatter_reduce_sum) for src_device_type 'cpu'")
    for dotted in _SCATTER_FALLBACK_HOLDERS:
        if _original(getattr(_module(name, dotted), "use_scatter_fallback", None)) is not fn:
            _fail(name, f"{dotted} no longer holds torch._inductor.utils.use_scatter_fallback")


def _apply_scatter_fallback() -> None:
    def make(original):
        signature = inspect.signature(original)

        def use_scatter_fallback(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            if bound.arguments["src_device_type"] == "neuron":
                bound.arguments["src_device_type"] = "cpu"
            return original(*bound.args, **bound.kwargs)
        return use_scatter_fallback

    for dotted in ("torch._inductor.utils", *_SCATTER_FALLBACK_HOLDERS):
        _replace(importlib.import_module(dotted), "use_scatter_fallback", make)


_register(
    "inductor-scatter-fallback",
    target="torch._inductor.utils.use_scatter_fallback, and the same name in lowering and decomposition, "
           "answers for neuron as for the CPU",
    why="Whether a scatter_add/scatter_reduce(sum) runs as ATen's kernel or inside a generated kernel with "
        "atomic adds is the code generator's choice, and Inductor makes it for the C++ backend by device "
        "type 'cpu' (config.cpp.fallback_scatter_reduce_sum). neuron's kernels are that backend's, so they "
        "take its choice. The other path is one the C++ backend is not run with: on the AVX2 path its "
        "generated kernel for max_pool2d's backward (the atomic scatter of the gradient, tiled by 8 rows) "
        "writes row r + i at 256 * r + 512 * i, giving wrong gradients silently, or an 'index out of "
        "bounds' abort when the stale indices it then reads fall outside the window. Stock Inductor on CPU "
        "tensors gives the same wrong gradients with fallback_scatter_reduce_sum off.",
    check=_check_scatter_fallback, apply=_apply_scatter_fallback)


# --------------------------------------------------------------------------- inductor-wrapper-overrides

def _check_wrapper_overrides() -> None:
    name = "inductor-wrapper-overrides"
    wrapper = _module(name, "torch._inductor.codegen.wrapper")
    PythonWrapperCodegen = _require(name, wrapper, "PythonWrapperCodegen", "torch._inductor.codegen.wrapper")
    for cls_name in ("PythonWrapperCodegen", "SubgraphPythonWrapperCodegen"):
        where = f"torch._inductor.codegen.wrapper.{cls_name}"
        cls = _require(name, wrapper, cls_name, "torch._inductor.codegen.wrapper")
        helper = _require(name, cls, "_generate_kernel_call_helper", where)
        _require_params(name, helper, f"{where}._generate_kernel_call_helper",
                        ("self", "kernel_name", "call_args", "device", "triton"))
    where = "torch._inductor.codegen.wrapper.PythonWrapperCodegen"
    _require_params(name, _require(name, PythonWrapperCodegen, "make_allocation", where), f"{where}.make_allocation",
                    ("self", "name", "device", "dtype", "shape", "stride", "allocation_shape", "is_pinned"))
    _require_params(name, _require(name, PythonWrapperCodegen, "create", where), f"{where}.create",
                    ("is_subgraph", "subgraph_name", "parent_wrapper", "partition_signatures"))
    _require(name, PythonWrapperCodegen, "write_header", where)


_register(
    "inductor-wrapper-overrides",
    target="(checked only) PythonWrapperCodegen._generate_kernel_call_helper (private), make_allocation, "
           "create and write_header, and SubgraphPythonWrapperCodegen._generate_kernel_call_helper, which "
           "neuron's wrapper classes override (compile/inductor_device.py)",
    why="neuron's wrapper queues each C++ kernel call as a device task (neuron_launch) where the CPU "
        "wrapper calls the kernel, imports the launcher in its header, and names the device index in "
        "allocations. If PyTorch renamed one of these methods nothing would fail: the override would "
        "just never run (kernels called on the host instead of queued on the stream). Checked when "
        "neuron is registered with Inductor.",
    check=_check_wrapper_overrides)


# --------------------------------------------------------------------------- inductor-compiled-callable

def _check_compiled_callable() -> None:
    name = "inductor-compiled-callable"
    CompiledFxGraph = _require(name, _module(name, "torch._inductor.output_code"), "CompiledFxGraph",
                               "torch._inductor.output_code")
    if "current_callable" not in getattr(CompiledFxGraph, "__annotations__", {}):
        _fail(name, "CompiledFxGraph no longer declares current_callable")
    call = getattr(CompiledFxGraph.__call__, "__code__", None)
    if call is None or "current_callable" not in call.co_names:
        _fail(name, "CompiledFxGraph.__call__ no longer calls self.current_callable")


def _apply_compiled_callable(compiled, wrap: Callable[[Callable], Callable]):
    """Replaces ``compiled.current_callable`` by ``wrap(current_callable)``; returns ``compiled``."""
    if getattr(compiled, "current_callable", None) is not None:
        compiled.current_callable = wrap(compiled.current_callable)
    return compiled


_register(
    "inductor-compiled-callable",
    target="CompiledFxGraph.current_callable of each graph compile_fx_inner returns, for "
           "mode='reduce-overhead'",
    why="reduce-overhead records a compiled graph's device work and replays it as one task "
        "(compile/replay.py): the boxed callable the compiled graph calls is wrapped, as Inductor "
        "itself wraps it for CUDA graphs.",
    check=_check_compiled_callable, apply=_apply_compiled_callable)


# --------------------------------------------------------------------------- nki-kernel-dynamo-disable

def _check_kernel_dynamo_disable() -> None:
    name = "nki-kernel-dynamo-disable"
    disable = _require(name, torch.compiler, "disable", "torch.compiler")
    _require_params(name, disable, "torch.compiler.disable", ("fn", "recursive", "reason"))


def _apply_kernel_dynamo_disable(kernel_class: type) -> None:
    # the class comes from the caller (nki/torch_bridge.py): the NKI emulator builds on this module
    _replace(kernel_class, "__call__", lambda original: torch.compiler.disable(
        original, reason="NKI kernels run eagerly; use nki_op in compiled code"))


_register(
    "nki-kernel-dynamo-disable",
    target="torchneuron.nki.Kernel.__call__ (our own class) wrapped in torch.compiler.disable, when the "
           "torch side of NKI loads (nki/torch_bridge.py)",
    why="Dynamo must not trace the NKI emulator: a direct kernel call inside a compiled region runs "
        "eagerly (a graph break); nki_op makes a kernel one graph node instead. torchneuron.nki does not "
        "import torch, so the method is wrapped when the torch bridge is imported.",
    check=_check_kernel_dynamo_disable, apply=_apply_kernel_dynamo_disable)


# --------------------------------------------------------------------------- set-num-threads

def _check_set_num_threads() -> None:
    name = "set-num-threads"
    for attr in ("set_num_threads", "get_num_threads"):
        _require(name, torch, attr, "torch")
    count = torch.get_num_threads()
    if not isinstance(count, int) or count < 1:
        _fail(name, f"torch.get_num_threads() returned {count!r}, expected a positive int")


def _apply_set_num_threads() -> None:
    def make(original):
        def set_num_threads(n):
            original(n)  # raises on a bad count, before the device hears of it
            _C._set_host_thread_count(torch.get_num_threads())
        set_num_threads.__doc__ = original.__doc__
        return set_num_threads

    _replace(torch, "set_num_threads", make)
    _C._set_host_thread_count(torch.get_num_threads())


_register(
    "set-num-threads",
    target="torch.set_num_threads, wrapped to report the new count to the device "
           "(csrc/bridge/exec/thread_count.h), when torchneuron loads",
    why="ATen keeps the intra-op thread count per thread and a reduction's split, so its rounding, "
        "follows it; torch.set_num_threads sets only the calling thread's. Kernels on the device's "
        "threads run with the count the host's CPU work uses, which only this call tells. "
        "PyTorch has no hook for it.",
    check=_check_set_num_threads, apply=_apply_set_num_threads)


# --------------------------------------------------------------------------- c10d-default-backend

_C10D = "torch.distributed.distributed_c10d"


def _check_c10d_default_backend() -> None:
    name = "c10d-default-backend"
    c10d = _module(name, _C10D)
    helper = _require(name, c10d, "_new_process_group_helper", _C10D)
    _require_params(name, helper, f"{_C10D}._new_process_group_helper",
                    ("group_size", "group_rank", "global_ranks_in_group", "backend"))
    for attr in ("_set_default_backend", "name"):
        _require(name, c10d.ProcessGroup, attr, f"{_C10D}.ProcessGroup")
    if not hasattr(c10d.ProcessGroup.BackendType, "CUSTOM"):
        _fail(name, "ProcessGroup.BackendType.CUSTOM no longer exists")
    config = getattr(c10d, "BackendConfig", None)
    if config is None or not callable(getattr(config, "get_device_backend_map", None)):
        _fail(name, f"{_C10D}.BackendConfig.get_device_backend_map no longer exists")
    mapped = c10d.BackendConfig(c10d.Backend("cpu:gloo,neuron:neuron")).get_device_backend_map()
    if mapped != {"cpu": "gloo", "neuron": "neuron"}:
        _fail(name, f"BackendConfig maps 'cpu:gloo,neuron:neuron' to {mapped}, expected "
                    "{'cpu': 'gloo', 'neuron': 'neuron'}")


def _apply_c10d_default_backend() -> None:
    import torch.distributed.distributed_c10d as c10d

    def make(original):
        signature = inspect.signature(original)

        def _new_process_group_helper(*args, **kwargs):
            result = original(*args, **kwargs)
            pg = result[0]
            backend = signature.bind(*args, **kwargs).arguments["backend"]
            if isinstance(pg, c10d.ProcessGroup):
                mapped = set(c10d.BackendConfig(c10d.Backend(str(backend))).get_device_backend_map().values())
                if "neuron" in mapped and c10d.Backend.NCCL not in mapped:
                    pg._set_default_backend(c10d.ProcessGroup.BackendType.CUSTOM)
            return result
        _new_process_group_helper.__doc__ = original.__doc__
        return _new_process_group_helper

    _replace(c10d, "_new_process_group_helper", make)


_register(
    "c10d-default-backend",
    target=f"{_C10D}._new_process_group_helper, wrapped: a group whose devices map to the neuron "
           "backend (and none to NCCL) gets the custom backend type as its default, when torchneuron "
           "loads",
    why="A group's default backend type is what the DDP logger, _has_hooks and the sequence numbers "
        "look up. PyTorch sets it to GLOO for init_process_group() with no backend unless NCCL is "
        "mapped, though the group then holds only the neuron backend, so DDP's constructor fails "
        "('Could not find backend type 1 for Process Group with name gloo'); for a list such as "
        "'cpu:gloo,neuron:neuron' it compares Backend._plugins' upper-case names with the map's "
        "lower-case ones, never matches and leaves UNDEFINED, which no backend has ('No backend of "
        "type 0 found' at destroy_process_group). The type PyTorch means to set there, as NCCL for "
        "CUDA, is the device backend's: CUSTOM. It is fixed after the group is made, before anything "
        "reads it; there is no hook for it.",
    check=_check_c10d_default_backend, apply=_apply_c10d_default_backend)


# --------------------------------------------------------------------------- mp-neuron-storage

def _check_mp_neuron_storage() -> None:
    name = "mp-neuron-storage"
    reductions = _module(name, "torch.multiprocessing.reductions")
    from multiprocessing.reduction import ForkingPickler

    registered = getattr(ForkingPickler, "_extra_reducers", {}).get(torch.UntypedStorage)
    if _original(registered) is not _require(name, reductions, "reduce_storage", "torch.multiprocessing.reductions"):
        _fail(name, "ForkingPickler's reducer of torch.UntypedStorage is no longer "
                    "torch.multiprocessing.reductions.reduce_storage")
    for attr in ("storage_from_cache", "StorageWeakRef"):
        _require(name, reductions, attr, "torch.multiprocessing.reductions")
    if not hasattr(reductions, "shared_cache"):
        _fail(name, "torch.multiprocessing.reductions.shared_cache no longer exists")


def _apply_mp_neuron_storage() -> None:
    from multiprocessing.reduction import ForkingPickler

    original = ForkingPickler._extra_reducers[torch.UntypedStorage]
    if hasattr(original, _ORIGINAL):
        return

    def reduce_storage(storage):
        return sharing.reduce_storage(storage, original)
    setattr(reduce_storage, _ORIGINAL, original)
    ForkingPickler.register(torch.UntypedStorage, reduce_storage)


_register(
    "mp-neuron-storage",
    target="the reducer torch.multiprocessing registers for torch.UntypedStorage with "
           "multiprocessing's ForkingPickler, wrapped: neuron storages take torchneuron.sharing's, "
           "others PyTorch's, when torchneuron loads",
    why="torch.multiprocessing shares CUDA tensors through CUDA IPC and every other storage as a CPU "
        "one: a neuron storage fails in the sender's queue feeder thread, and the receiver waits "
        "until its timeout. PyTorch has no hook for another device's sharing.",
    check=_check_mp_neuron_storage, apply=_apply_mp_neuron_storage)


# --------------------------------------------------------------------------- c10d-monitored-barrier

def _check_c10d_monitored_barrier() -> None:
    name = "c10d-monitored-barrier"
    c10d = _module(name, _C10D)
    barrier = _require(name, c10d, "monitored_barrier", _C10D)
    _require_params(name, barrier, f"{_C10D}.monitored_barrier", ("group", "timeout", "wait_all_ranks"))
    for attr in ("_rank_not_in_group", "get_backend", "_get_default_timeout", "_check_valid_timeout",
                 "_get_default_group"):
        _require(name, c10d, attr, _C10D)
    _require(name, _module(name, "torch._C._distributed_c10d").Backend, "monitored_barrier",
             "torch._C._distributed_c10d.Backend")
    if "only implemented for GLOO" not in _source(name, barrier, f"{_C10D}.monitored_barrier"):
        _fail(name, f"{_C10D}.monitored_barrier no longer refuses backends other than gloo, expected "
                    "its 'only implemented for GLOO backend' check (the patch may be unnecessary now)")


def _apply_c10d_monitored_barrier() -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from datetime import timedelta

    def make(original):
        def monitored_barrier(group=c10d.GroupMember.WORLD, timeout=None, wait_all_ranks=False):
            if c10d._rank_not_in_group(group):
                return original(group, timeout, wait_all_ranks)
            backend = c10d.get_backend(group)
            if "neuron" not in c10d.BackendConfig(c10d.Backend(str(backend))).get_device_backend_map().values():
                return original(group, timeout, wait_all_ranks)
            # as the original does for gloo
            if timeout is None:
                timeout = c10d._get_default_timeout(backend)
            elif isinstance(timeout, float):
                timeout = timedelta(seconds=timeout)
            c10d._check_valid_timeout(timeout)
            pg = c10d._get_default_group() if group is None else group
            return pg._get_backend(torch.device("neuron")).monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
        monitored_barrier.__doc__ = original.__doc__
        return monitored_barrier

    _replace(c10d, "monitored_barrier", make)
    dist.monitored_barrier = c10d.monitored_barrier


_register(
    "c10d-monitored-barrier",
    target=f"{_C10D}.monitored_barrier (and torch.distributed's name for it), wrapped: for a group "
           "whose devices map to the neuron backend it calls that backend's monitored barrier; other "
           "groups go to the original",
    why="PyTorch refuses every backend but gloo by name ('monitored_barrier is only implemented for "
        "GLOO backend'), and its C++ side then dispatches a CPU tensor, which a group of the neuron "
        "backend alone has no backend for. The neuron backend's monitored barrier is gloo's own "
        "(csrc/bridge/distributed/process_group.h), so only the name check and the dispatch stand in "
        "the way; the wrapper keeps the original's timeout handling and calls the backend directly.",
    check=_check_c10d_monitored_barrier, apply=_apply_c10d_monitored_barrier)


# --------------------------------------------------------------------------- fake-conv-layout

_FAKE_CONV_OPS = ("convolution.default", "_convolution.default", "_convolution.deprecated",
                  "convolution_backward.default")


def _check_fake_conv_layout() -> None:
    name = "fake-conv-layout"
    impls = _module(name, "torch._subclasses.fake_impls")
    table = getattr(impls, "op_implementations_dict", None)
    if not isinstance(table, dict):
        _fail(name, "torch._subclasses.fake_impls.op_implementations_dict no longer exists")
    fns = {_original(table.get(_aten_op(op))) for op in _FAKE_CONV_OPS}
    if len(fns) != 1 or None in fns:
        _fail(name, f"fake_impls no longer registers one implementation for {', '.join(_FAKE_CONV_OPS)}")
    fn = fns.pop()
    _require_params(name, fn, "torch._subclasses.fake_impls.conv", ("fake_mode", "func"))
    source = _source(name, fn, "torch._subclasses.fake_impls.conv")
    if "input_.fake_device" not in source or "_conv_determine_backend_memory_format" not in source:
        _fail(name, "fake_impls.conv no longer picks the result layout from the input's fake device "
                    "(_select_conv_backend, _conv_determine_backend_memory_format)")


def _aten_op(qualified: str):
    packet, _, overload = qualified.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload)


def _apply_fake_conv_layout() -> None:
    from torch._subclasses import fake_impls
    from torch._subclasses.fake_tensor import FakeTensor

    table = fake_impls.op_implementations_dict
    original = table[_aten_op(_FAKE_CONV_OPS[0])]
    if hasattr(original, _ORIGINAL):
        return

    def retyped(fake_mode, t, device):
        if not isinstance(t, FakeTensor):
            return t
        return FakeTensor(fake_mode, torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta"),
                          device)

    def conv(fake_mode, func, *args, **kwargs):
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, FakeTensor)]
        device = tensors[0].fake_device if tensors else None
        if device is None or device.type != "neuron" or any(
                isinstance(s, torch.SymInt) for t in tensors for s in (*t.shape, *t.stride())):
            return original(fake_mode, func, *args, **kwargs)
        cpu = torch.device("cpu")
        out = original(fake_mode, func, *(retyped(fake_mode, a, cpu) for a in args),
                       **{k: retyped(fake_mode, v, cpu) for k, v in kwargs.items()})
        if isinstance(out, tuple):
            return tuple(retyped(fake_mode, o, device) for o in out)
        return retyped(fake_mode, out, device)

    setattr(conv, _ORIGINAL, original)
    for op in _FAKE_CONV_OPS:
        table[_aten_op(op)] = conv


_register(
    "fake-conv-layout",
    target="torch._subclasses.fake_impls' implementation of convolution and convolution_backward: for "
           "neuron inputs (static shapes) it answers what it answers for CPU inputs of the same sizes, "
           "strides and dtypes, on neuron",
    why="the fake kernel picks the result layout by the backend ATen would select for the input's device; "
        "for neuron that is the 'overrideable' backend, always contiguous, while neuron runs the CPU's "
        "convolution (oneDNN for float), whose results are channels-last for channels-last inputs. Eager "
        "neuron returned that layout and compiled graphs another (contiguous, paid for by a transposing "
        "copy), and Inductor could not keep a conv net channels-last between its kernels.",
    check=_check_fake_conv_layout, apply=_apply_fake_conv_layout)


# --------------------------------------------------------------------------- inductor-layout-opt

def _check_layout_opt() -> None:
    name = "inductor-layout-opt"
    graph = _module(name, "torch._inductor.graph")
    if not isinstance(getattr(graph, "SUPPORTED_MKLDNN_DEVICES", None), tuple):
        _fail(name, "torch._inductor.graph.SUPPORTED_MKLDNN_DEVICES is no longer a tuple")
    lowering = _require(name, graph, "GraphLowering", "torch._inductor.graph")
    module_source = _source(name, graph, "torch._inductor.graph")
    source = _source(name, getattr(lowering, "decide_layout_opt", None),
                     "torch._inductor.graph.GraphLowering.decide_layout_opt")
    if module_source.count("SUPPORTED_MKLDNN_DEVICES") != 2 or "in SUPPORTED_MKLDNN_DEVICES" not in source:
        _fail(name, "torch._inductor.graph no longer reads SUPPORTED_MKLDNN_DEVICES only in decide_layout_opt "
                    "(where every convolution on such a device turns channels-last on)")


def _apply_layout_opt() -> None:
    from torch._inductor import graph

    if "neuron" not in graph.SUPPORTED_MKLDNN_DEVICES:
        graph.SUPPORTED_MKLDNN_DEVICES = (*graph.SUPPORTED_MKLDNN_DEVICES, "neuron")


_register(
    "inductor-layout-opt",
    target="torch._inductor.graph.SUPPORTED_MKLDNN_DEVICES (the name graph.py imported, read only by "
           "decide_layout_opt) includes neuron; torch._inductor.utils' tuple, read by the mkldnn passes, "
           "is unchanged",
    why="Inductor runs a graph whose convolutions are all oneDNN's channels-last (inputs and weights "
        "converted at the graph's start, the element-wise kernels between convolutions vectorised over "
        "channels, oneDNN's faster channels-last kernels, no reorders between them); for "
        "other devices it applies heuristics tuned for cuDNN. neuron's convolutions are the CPU's oneDNN "
        "kernels (with fake-conv-layout, their result layouts are known at compile time too), so neuron "
        "graphs decide as CPU graphs do.",
    check=_check_layout_opt, apply=_apply_layout_opt)


# --------------------------------------------------------------------------- inductor-conv-bias

def _check_conv_bias() -> None:
    name = "inductor-conv-bias"
    conv = _module(name, "torch._inductor.kernel.conv")
    lowering = _module(name, "torch._inductor.lowering")
    fn = _require(name, conv, "convolution", "torch._inductor.kernel.conv")
    if _original(lowering.lowerings.get(torch.ops.aten.convolution.default)) is not fn:
        _fail(name, "torch._inductor.kernel.conv.convolution no longer is the lowering of aten.convolution")
    if not hasattr(getattr(conv, "ir", None), "get_device_type"):
        _fail(name, "torch._inductor.kernel.conv no longer reaches get_device_type through its module name ir")
    source = _source(name, fn, "torch._inductor.kernel.conv.convolution")
    if (source.count("ir.get_device_type(") != 1 or 'bias is not None and device_type != "cpu"' not in source
            or "device_type" not in source):
        _fail(name, "the convolution lowering no longer asks ir.get_device_type once, to keep the bias in the "
                    "convolution on the CPU only")


class _NeuronAsCpuIr:
    """torch._inductor.ir as torch._inductor.kernel.conv sees it during one neuron lowering."""

    def __init__(self, ir):
        self._ir = ir

    def __getattr__(self, attr):
        return getattr(self._ir, attr)

    def get_device_type(self, x):
        t = self._ir.get_device_type(x)
        return "cpu" if t == "neuron" else t


def _apply_conv_bias() -> None:
    from torch._inductor import ir, lowering
    from torch._inductor.kernel import conv

    original = lowering.lowerings[torch.ops.aten.convolution.default]
    if hasattr(original, _ORIGINAL):
        return

    def convolution(x, *args, **kwargs):
        if ir.get_device_type(x) != "neuron":
            return original(x, *args, **kwargs)
        # Lowering runs on one thread, the one compiling; the check makes sure the device type is asked once.
        conv.ir = _NeuronAsCpuIr(ir)
        try:
            return original(x, *args, **kwargs)
        finally:
            conv.ir = ir

    setattr(convolution, _ORIGINAL, original)
    lowering.lowerings[torch.ops.aten.convolution.default] = convolution


_register(
    "inductor-conv-bias",
    target="the lowering of aten.convolution (torch._inductor.kernel.conv.convolution), whose "
           "ir.get_device_type answers 'cpu' for neuron inputs during the call",
    why="Inductor takes the bias out of every convolution not on the CPU (cuDNN is slower with it) and adds "
        "it in the next element-wise kernel; that changes the fusion of the whole block (batch norm, ReLU, "
        "pooling and, in training, their backward, then sized by the bias's gradient) from the CPU's. "
        "neuron's convolutions are the CPU's oneDNN kernels, which add the bias themselves, as eager neuron "
        "does.",
    check=_check_conv_bias, apply=_apply_conv_bias)


# --------------------------------------------------------------------------- flex-device

_FLEX = "torch.nn.attention.flex_attention"


def _check_flex_device() -> None:
    name = "flex-device"
    flex = _module(name, _FLEX)
    fn = _require(name, flex, "_validate_device", _FLEX)
    _require_params(name, fn, f"{_FLEX}._validate_device", ("query", "key", "value"))
    source = _source(name, fn, f"{_FLEX}._validate_device")
    if "supported_devices = {" not in source or "FlexAttention is only supported on" not in source:
        _fail(name, f"{_FLEX}._validate_device no longer refuses devices outside its supported_devices set "
                    "(the patch may be unnecessary now)")
    if "_validate_device(query, key, value)" not in _source(name, _require(name, flex, "flex_attention", _FLEX),
                                                            f"{_FLEX}.flex_attention"):
        _fail(name, f"{_FLEX}.flex_attention no longer calls _validate_device(query, key, value) by its module name")


def _apply_flex_device() -> None:
    from torch.nn.attention import flex_attention as flex

    def make(original):
        def _validate_device(query, key, value):
            if query.device.type == "neuron":
                return None
            return original(query, key, value)
        return _validate_device

    _replace(flex, "_validate_device", make)


_register(
    "flex-device",
    target=f"{_FLEX}._validate_device (read by name by flex_attention) accepts neuron inputs; other devices "
           "get the original's answer",
    why="flex_attention refuses every device outside a fixed set (CUDA, CPU, XPU, HPU, MPS) before it does "
        "anything device-specific. Its eager path is a math implementation over ordinary operators (run as "
        "neuron's device operators), its backward too, and compiled graphs lower through Inductor "
        "(inductor-flex-cpu-template, inductor-flex-dense). The CPU's refusal of backward is not taken over: "
        "the math backward runs on neuron as any other autograd graph.",
    check=_check_flex_device, apply=_apply_flex_device)


# --------------------------------------------------------------------------- inductor-flex-cpu-template

_FLEX_LOWERING = "torch._inductor.kernel.flex.flex_attention"


def _flex_reads_only_output(node) -> bool:
    """Whether the graph reads only result 0 (the attention output) of flex_attention ``node``."""
    import operator
    return all(u.target is operator.getitem and u.args[1] == 0 for u in node.users)


def _check_flex_cpu_template() -> None:
    name = "inductor-flex-cpu-template"
    low = _module(name, _FLEX_LOWERING)
    lowering = _module(name, "torch._inductor.lowering")
    fn = _require(name, low, "flex_attention", _FLEX_LOWERING)
    if _original(lowering.lowerings.get(torch.ops.higher_order.flex_attention)) is not fn:
        _fail(name, f"{_FLEX_LOWERING}.flex_attention no longer is the lowering of higher_order.flex_attention")
    lower_cpu = _require(name, low, "lower_cpu", _FLEX_LOWERING)
    params = ("query", "key", "value", "subgraph", "block_mask", "scale", "kernel_options",
              "score_mod_other_buffers", "mask_mod_other_buffers")
    _require_params(name, fn, f"{_FLEX_LOWERING}.flex_attention", params)
    _require_params(name, lower_cpu, f"{_FLEX_LOWERING}.lower_cpu", params)
    if 'if query.get_device().type == "cpu":\n        return lower_cpu(' not in _source(
            name, fn, f"{_FLEX_LOWERING}.flex_attention"):
        _fail(name, "the flex_attention lowering no longer hands CPU inputs to lower_cpu (the C++ template) by "
                    "query.get_device().type == 'cpu'")
    source = _source(name, lower_cpu, f"{_FLEX_LOWERING}.lower_cpu")
    if 'if kernel_options["OUTPUT_LOGSUMEXP"]:' not in source or "OUTPUT_MAX" in source:
        _fail(name, "lower_cpu no longer refuses OUTPUT_LOGSUMEXP (and ignores OUTPUT_MAX): the patch decides "
                    "by these which graphs the C++ template serves")


def _apply_flex_cpu_template() -> None:
    from torch._inductor import lowering
    from torch._inductor.kernel.flex import flex_attention as low
    from torch._inductor.virtualized import V

    original = lowering.lowerings[torch.ops.higher_order.flex_attention]
    if hasattr(original, _ORIGINAL):
        return

    def flex_attention(query, key, value, subgraph, block_mask, scale, kernel_options, *args, **kwargs):
        if query.get_device().type != "neuron":
            return original(query, key, value, subgraph, block_mask, scale, kernel_options, *args, **kwargs)
        if not _flex_reads_only_output(V.graph.current_node):
            raise NotImplementedError(
                "flex_attention on neuron: a compiled graph that reads its logsumexp (return_lse, or the forward "
                "of a training step) is computed by the dense decomposition of patch 'inductor-flex-dense', "
                "which runs among Inductor's post-grad passes; they are turned off (config.use_post_grad_passes)")
        # the graph reads the output alone: the lse flex computes whenever grad is enabled is not needed
        options = {**kernel_options, "OUTPUT_LOGSUMEXP": False, "OUTPUT_MAX": False}
        return low.lower_cpu(query, key, value, subgraph, block_mask, scale, options, *args, **kwargs)

    setattr(flex_attention, _ORIGINAL, original)
    lowering.lowerings[torch.ops.higher_order.flex_attention] = flex_attention


_register(
    "inductor-flex-cpu-template",
    target="the lowering of higher_order.flex_attention: neuron inputs whose graph reads only the attention "
           "output go to lower_cpu, the CPU's C++ template, with the logsumexp and max outputs off",
    why="the lowering sends device type 'cpu' to the C++ template (and MPS to Metal) and every other device to "
        "the Triton template, which neuron cannot run; neuron's kernels are the C++ backend's, so neuron takes "
        "the CPU's template and its kernel runs as a device task. flex computes the logsumexp whenever grad is "
        "enabled on a non-CPU device, which the template refuses: when the graph does not read it (inference), "
        "it is turned off; graphs that read it are decomposed before lowering (inductor-flex-dense).",
    check=_check_flex_cpu_template, apply=_apply_flex_cpu_template)


# --------------------------------------------------------------------------- inductor-flex-dense

_POST_GRAD = "torch._inductor.fx_passes.post_grad"
_POST_GRAD_HOLDERS = (_POST_GRAD, "torch._inductor.compile_fx")


def _check_flex_dense() -> None:
    name = "inductor-flex-dense"
    hops = _module(name, "torch._higher_order_ops.flex_attention")
    for attr in ("sdpa_dense", "sdpa_dense_backward"):
        _require(name, hops, attr, "torch._higher_order_ops.flex_attention")
    _require_params(name, hops.sdpa_dense, "torch._higher_order_ops.flex_attention.sdpa_dense",
                    ("query", "key", "value", "score_mod", "block_mask", "scale", "kernel_options",
                     "score_mod_other_buffers", "mask_mod_other_buffers"))
    _require_params(name, hops.sdpa_dense_backward, "torch._higher_order_ops.flex_attention.sdpa_dense_backward",
                    ("query", "key", "value", "out", "logsumexp", "grad_out", "grad_logsumexp", "fw_graph",
                     "joint_graph", "block_mask", "scale", "kernel_options", "score_mod_other_buffers",
                     "mask_mod_other_buffers"))
    post_grad = _module(name, _POST_GRAD)
    fn = _require(name, post_grad, "post_grad_passes", _POST_GRAD)
    _require_params(name, fn, f"{_POST_GRAD}.post_grad_passes", ("gm", "is_inference"))
    for dotted in _POST_GRAD_HOLDERS:
        if _original(getattr(_module(name, dotted), "post_grad_passes", None)) is not fn:
            _fail(name, f"{dotted} no longer holds {_POST_GRAD}.post_grad_passes")
    pm = _module(name, "torch._inductor.pattern_matcher")
    for attr in ("PatternMatcherPass", "CallFunctionVarArgs", "register_graph_pattern"):
        _require(name, pm, attr, "torch._inductor.pattern_matcher")
    _require(name, pm.Match, "replace_by_example", "torch._inductor.pattern_matcher.Match")
    flex_cpu = _module(name, "torch._inductor.kernel.flex.flex_cpu")
    _require(name, flex_cpu, "check_cpu_supported", "torch._inductor.kernel.flex.flex_cpu")


def _flex_template_serves(node) -> bool:
    """Whether the C++ template (inductor-flex-cpu-template) lowers flex_attention ``node``."""
    from torch._inductor.kernel.flex.flex_cpu import check_cpu_supported

    query = node.args[0].meta["val"]
    return (_flex_reads_only_output(node) and check_cpu_supported()
            and query.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and all(node.args[i].meta["val"].dtype == query.dtype for i in (1, 2)))


def _decompose_neuron_flex(gm) -> None:
    """Replaces neuron flex_attention nodes the C++ template does not serve, and every neuron
    flex_attention_backward node, by the graph of the operator's own dense implementation."""
    import torch.fx
    import torch.utils._pytree as pytree
    from torch._inductor.pattern_matcher import CallFunctionVarArgs, PatternMatcherPass, register_graph_pattern

    def on_neuron(node) -> bool:
        val = node.args[0].meta.get("val")
        return isinstance(val, torch.Tensor) and val.device.type == "neuron"

    hops = importlib.import_module("torch._higher_order_ops.flex_attention")  # the package's name is the operator

    def trace(fn, args):
        # The dense implementations make 0-dim constants (torch.tensor(-inf)) that tracing keeps as
        # real tensors held by the graph; the graph they join holds fake ones. As full() they are
        # operators, lowered like the rest.
        from torch._inductor.pattern_matcher import fwd_only
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        traced = fwd_only(fn, args, run_functional_passes=False)
        for n in list(traced.graph.nodes):
            value = getattr(traced, n.target, None) if n.op == "get_attr" else None
            if isinstance(value, torch.Tensor) and value.dim() == 0:
                with traced.graph.inserting_before(n):
                    with unset_fake_temporarily():  # tracing runs in the graph's fake mode
                        scalar = value.item()
                    full = traced.graph.call_function(torch.ops.aten.full.default, ([], scalar),
                                                      {"dtype": value.dtype, "device": value.device})
                n.replace_all_uses_with(full)
                traced.graph.erase_node(n)
        traced.recompile()
        return traced
    graph_pass = PatternMatcherPass()
    for hop, dense, forward in ((torch.ops.higher_order.flex_attention, hops.sdpa_dense, True),
                                (torch.ops.higher_order.flex_attention_backward, hops.sdpa_dense_backward, False)):
        def extra_check(match, forward=forward):
            node = match.nodes[0]
            return on_neuron(node) and not (forward and _flex_template_serves(node))

        def replace(match, *args, dense=dense, **kwargs):
            # score and mask graphs are get_attr nodes: the dense implementation is traced with the
            # modules themselves, and with fake values for every other node
            def resolve(a):
                if isinstance(a, torch.fx.Node) and a.op == "get_attr":
                    return gm.get_submodule(a.target)
                return a
            leaves, spec = pytree.tree_flatten(pytree.tree_map(resolve, (args, kwargs)))
            where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.fx.Node)]

            def decomposition(*values):
                filled = list(leaves)
                for i, v in zip(where, values):
                    filled[i] = v
                a, kw = pytree.tree_unflatten(filled, spec)
                return dense(*a, **kw)

            match.replace_by_example(decomposition, [leaves[i] for i in where], trace_fn=trace)

        register_graph_pattern(CallFunctionVarArgs(hop), extra_check=extra_check, pass_dict=graph_pass)(replace)
    graph_pass.apply(gm.graph)
    gm.graph.eliminate_dead_code()
    gm.recompile()


def _apply_flex_dense() -> None:
    post_grad = importlib.import_module(_POST_GRAD)
    original = post_grad.post_grad_passes
    if hasattr(original, _ORIGINAL):
        return

    def post_grad_passes(gm, is_inference):
        if any(n.op == "call_function" and n.target in (torch.ops.higher_order.flex_attention,
                                                        torch.ops.higher_order.flex_attention_backward)
               for n in gm.graph.nodes):
            _decompose_neuron_flex(gm)
        return original(gm, is_inference)

    setattr(post_grad_passes, _ORIGINAL, original)
    for dotted in _POST_GRAD_HOLDERS:
        importlib.import_module(dotted).post_grad_passes = post_grad_passes


_register(
    "inductor-flex-dense",
    target=f"{_POST_GRAD}.post_grad_passes (and compile_fx's name for it) first replaces neuron flex_attention "
           "nodes whose logsumexp the graph reads, and every neuron flex_attention_backward node, by the "
           "operators' own dense implementations (sdpa_dense, sdpa_dense_backward), traced",
    why="Inductor's only lowerings of flex_attention with its logsumexp, and of its backward, are Triton "
        "templates; the CPU's C++ template serves inference alone (PyTorch refuses flex training on the CPU). "
        "The dense implementations are what eager flex runs (on neuron too); decomposed into ordinary "
        "operators they are lowered by Inductor like the rest of the graph, into C++ kernels and extern "
        "matmuls, so compiled training and return_lse work on neuron. Inductor decomposes other higher-order "
        "operators the same way in its post-grad passes; there is no hook that runs for every compilation.",
    check=_check_flex_dense, apply=_apply_flex_dense)


# --------------------------------------------------------------------------- nn-parallel-comm

_COMM = "torch.nn.parallel.comm"
_COMM_FUNCTIONS = {  # comm function: the CUDA-only torch._C functions it calls
    "broadcast": ("_broadcast", "_broadcast_out"),
    "broadcast_coalesced": ("_broadcast_coalesced",),
    "scatter": ("_scatter", "_scatter_out"),
    "gather": ("_gather", "_gather_out"),
}


def _check_parallel_comm() -> None:
    name = "nn-parallel-comm"
    comm = _module(name, _COMM)
    params = {"broadcast": ("tensor", "devices", "out"), "broadcast_coalesced": ("tensors", "devices", "buffer_size"),
              "scatter": ("tensor", "devices", "chunk_sizes", "dim", "streams", "out"),
              "gather": ("tensors", "dim", "destination", "out")}
    for fn_name, c_names in _COMM_FUNCTIONS.items():
        fn = _require(name, comm, fn_name, _COMM)
        _require_params(name, fn, f"{_COMM}.{fn_name}", params[fn_name])
        source = _source(name, fn, f"{_COMM}.{fn_name}")
        missing = [c for c in c_names if f"torch._C.{c}(" not in source]
        if missing:
            _fail(name, f"{_COMM}.{fn_name} no longer calls {', '.join('torch._C.' + c for c in missing)} "
                        "(the calls the patch replaces for neuron tensors)")
    # the callers DataParallel goes through reach comm by module attribute, so rebinding it reaches them
    for dotted, uses in (("torch.nn.parallel._functions", ("comm.broadcast_coalesced(", "comm.scatter(",
                                                            "comm.gather(", "comm.reduce_add_coalesced(")),
                         ("torch.nn.parallel.replicate", ("comm.broadcast_coalesced(",))):
        source = _source(name, _module(name, dotted), dotted)
        absent = [u for u in uses if u not in source]
        if absent:
            _fail(name, f"{dotted} no longer calls {', '.join(a.rstrip('(') for a in absent)} by module attribute")
    # reduce_add (the gradients' sum over replicas) must stay device-generic: no torch._C call
    if "torch._C." in _source(name, _require(name, comm, "reduce_add", _COMM), f"{_COMM}.reduce_add"):
        _fail(name, f"{_COMM}.reduce_add now calls into torch._C: check it for neuron tensors")


def _apply_parallel_comm() -> None:
    from torch._utils import _get_device_index, _handle_complex
    from torch.nn.parallel import comm


    def broadcast(original):
        def broadcast(tensor, devices=None, *, out=None):
            if not parallel_comm.handles([tensor, *(out or ())]):
                return original(tensor, devices, out=out)
            tensor = _handle_complex(tensor)
            if not ((devices is None) ^ (out is None)):
                raise RuntimeError(f"Exactly one of 'devices' and 'out' must be specified, but got "
                                   f"devices={devices} and out={out}")
            if devices is not None:
                return tuple(parallel_comm.broadcast(tensor, [_get_device_index(d) for d in devices]))
            return tuple(parallel_comm.broadcast_out(tensor, out))
        return broadcast

    def broadcast_coalesced(original):
        def broadcast_coalesced(tensors, devices, buffer_size=10485760):
            if not parallel_comm.handles(list(tensors)):
                return original(tensors, devices, buffer_size)
            devices = [_get_device_index(d) for d in devices]
            return parallel_comm.broadcast_coalesced([_handle_complex(t) for t in tensors], devices, buffer_size)
        return broadcast_coalesced

    def scatter(original):
        def scatter(tensor, devices=None, chunk_sizes=None, dim=0, streams=None, *, out=None):
            if not parallel_comm.handles([tensor, *(out or ())]):
                return original(tensor, devices, chunk_sizes, dim, streams, out=out)
            tensor = _handle_complex(tensor)
            if out is None:
                return tuple(parallel_comm.scatter(tensor, [_get_device_index(d) for d in devices], chunk_sizes, dim,
                                            streams))
            if devices is not None:
                raise RuntimeError(f"'devices' must not be specified when 'out' is specified, but got devices={devices}")
            if chunk_sizes is not None:
                raise RuntimeError(f"'chunk_sizes' must not be specified when 'out' is specified, but got "
                                   f"chunk_sizes={chunk_sizes}")
            return tuple(parallel_comm.scatter_out(tensor, out, dim, streams))
        return scatter

    def gather(original):
        def gather(tensors, dim=0, destination=None, *, out=None):
            tensors = list(tensors)
            if not parallel_comm.handles(tensors + ([out] if out is not None else [])):
                return original(tensors, dim, destination, out=out)
            tensors = [_handle_complex(t) for t in tensors]
            if out is None:
                if destination == -1:
                    import warnings
                    warnings.warn('Using -1 to represent CPU tensor is deprecated. Please use a device object or '
                                  'string instead, e.g., "cpu".', FutureWarning, stacklevel=2)
                return parallel_comm.gather(tensors, dim, _get_device_index(destination, allow_cpu=True, optional=True))
            if destination is not None:
                raise RuntimeError(f"'destination' must not be specified when 'out' is specified, but got "
                                   f"destination={destination}")
            return parallel_comm.gather_out(tensors, out, dim)
        return gather

    for fn_name, make in (("broadcast", broadcast), ("broadcast_coalesced", broadcast_coalesced),
                          ("scatter", scatter), ("gather", gather)):
        _replace(comm, fn_name, make)


_register(
    "nn-parallel-comm",
    target=f"{_COMM}.broadcast, broadcast_coalesced, scatter and gather: calls whose tensors are on neuron "
           "(or all on the CPU while neuron is the accelerator) go to torchneuron/parallel_comm.py",
    why="nn.DataParallel is device-generic except for these four functions, which call C++ that PyTorch "
        "builds for CUDA only (torch._C._broadcast, _broadcast_coalesced, _scatter, _gather and the out= "
        "forms): absent from a CPU build, CUDA-only in a CUDA build. parallel_comm.py does the same with "
        "ordinary tensor operations, with the same checks and messages. DataParallel's other pieces (replica "
        "threads, reduce_add's sum of gradients) already work on neuron; other device types keep PyTorch's "
        "functions.",
    check=_check_parallel_comm, apply=_apply_parallel_comm)
