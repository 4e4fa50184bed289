"""torchneuron/_torch_patches.py: every change to PyTorch's Python internals,
each checked against the running PyTorch."""
import ast
import pathlib

import pytest
import torch

import torchneuron.compile
import torchneuron.nki.torch_bridge  # noqa: F401  (applies nki-kernel-dynamo-disable)
from torchneuron import _torch_patches
from torchneuron._torch_patches import PATCHES, TorchPatchError

from neuron_testing import ROOT, run_python

PACKAGE = pathlib.Path(ROOT) / "torchneuron"


@pytest.fixture(scope="module", autouse=True)
def _registered():
    torchneuron.compile.register()  # applies the Inductor patches


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_check_passes_on_this_pytorch(name):
    _torch_patches.check(name)


def test_module_docstring_lists_every_patch():
    assert [n for n in PATCHES if f"``{n}``" not in _torch_patches.__doc__] == []
    assert all(p.target and p.why for p in PATCHES.values())


def test_patched_targets_answer_for_neuron():
    from torch._inductor import config, ir, scheduler, utils

    class Node:
        def __init__(self, device):
            self.get_device = lambda: device

    neuron = torch.device("neuron")
    assert scheduler.BaseSchedulerNode.is_cpu(Node(neuron)) is True
    assert scheduler.BaseSchedulerNode.is_cpu(Node(torch.device("meta"))) is False
    assert ir.is_cpu(neuron) and ir.is_cpu(torch.device("cpu")) and not ir.is_cpu(torch.device("meta"))
    assert utils.get_current_backend("neuron") == config.cpu_backend
    assert utils.get_current_backend("cpu") == config.cpu_backend
    from torch._inductor import lowering
    assert lowering.is_gpu("neuron") and not lowering.is_gpu("cpu") and not utils.is_gpu("neuron")
    from torch._inductor import decomposition
    scatter_sum = (torch.ops.aten.scatter_reduce_.two, "sum", torch.float32, torch.float32)
    for fallback in (utils.use_scatter_fallback, lowering.use_scatter_fallback, decomposition.use_scatter_fallback):
        assert fallback(*scatter_sum, "neuron", True) == fallback(*scatter_sum, "cpu", True)
        assert fallback(*scatter_sum, src_device_type="neuron", src_is_tensor=True) == \
            fallback._torchneuron_original(*scatter_sum, "cpu", True)


def test_every_holder_of_get_current_backend_is_rebound():
    import sys

    from torch._inductor import utils
    from torch._inductor.codegen import common  # noqa: F401  (holders by name)
    from torch._inductor.kernel import mm_common  # noqa: F401

    patched = utils.get_current_backend
    original = patched._torchneuron_original
    holders = {k: m.__dict__["get_current_backend"] for k, m in list(sys.modules.items())
               if k.startswith("torch._inductor") and "get_current_backend" in getattr(m, "__dict__", {})}
    assert {"torch._inductor.utils", "torch._inductor.codegen.common", "torch._inductor.scheduler",
            "torch._inductor.kernel.mm_common"} <= set(holders)
    assert [k for k, fn in holders.items() if fn is original] == []


def test_apply_is_idempotent():
    from torch._inductor import ir, scheduler, utils

    before = (scheduler.BaseSchedulerNode.is_cpu, ir.is_cpu, utils.get_current_backend)
    torchneuron.compile.inductor_device.register()
    assert (scheduler.BaseSchedulerNode.is_cpu, ir.is_cpu, utils.get_current_backend) == before


def test_nki_kernel_call_is_not_traced_by_dynamo():
    from torchneuron.nki import Kernel

    assert getattr(Kernel.__call__, "_torchdynamo_disable", False)


def _missing(monkeypatch, name):
    """Takes patch ``name``'s target away (monkeypatch restores it)."""
    from torch._inductor import ir, utils
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    from torch._inductor.output_code import CompiledFxGraph

    if name == "inductor-is-cpu":
        monkeypatch.delattr(ir, "is_cpu")
    elif name == "inductor-current-backend":
        monkeypatch.delattr(utils, "get_current_backend")
    elif name == "inductor-argreduce-logical-index":
        from torch._inductor import lowering
        monkeypatch.delattr(lowering, "_make_reduction_inner")
    elif name == "inductor-pointwise-device":
        from torch._inductor import lowering
        monkeypatch.delattr(lowering, "is_gpu")
    elif name == "inductor-scatter-fallback":
        from torch._inductor import decomposition
        monkeypatch.delattr(decomposition, "use_scatter_fallback")
    elif name == "inductor-wrapper-overrides":
        monkeypatch.delattr(PythonWrapperCodegen, "_generate_kernel_call_helper")
    elif name == "inductor-compiled-callable":
        monkeypatch.setattr(CompiledFxGraph, "__call__", lambda self, inputs: None)
    elif name == "nki-kernel-dynamo-disable":
        monkeypatch.delattr(torch.compiler, "disable")
    elif name == "set-num-threads":
        monkeypatch.delattr(torch, "set_num_threads")
    elif name == "mp-neuron-storage":
        from multiprocessing.reduction import ForkingPickler
        monkeypatch.setitem(ForkingPickler._extra_reducers, torch.UntypedStorage, lambda storage: None)
    elif name == "c10d-default-backend":
        import torch.distributed.distributed_c10d as c10d
        monkeypatch.delattr(c10d, "_new_process_group_helper")
    elif name == "c10d-monitored-barrier":
        import torch.distributed.distributed_c10d as c10d
        monkeypatch.delattr(c10d, "monitored_barrier")
    elif name == "fake-conv-layout":
        from torch._subclasses import fake_impls
        monkeypatch.delitem(fake_impls.op_implementations_dict, torch.ops.aten.convolution_backward.default)
    elif name == "inductor-conv-bias":
        from torch._inductor.kernel import conv
        monkeypatch.delattr(conv, "convolution")
    elif name == "inductor-layout-opt":
        from torch._inductor import graph
        monkeypatch.delattr(graph, "SUPPORTED_MKLDNN_DEVICES")
    elif name == "flex-device":
        from torch.nn.attention import flex_attention
        monkeypatch.delattr(flex_attention, "_validate_device")
    elif name == "inductor-flex-cpu-template":
        from torch._inductor.kernel.flex import flex_attention
        monkeypatch.delattr(flex_attention, "lower_cpu")
    elif name == "inductor-flex-dense":
        import importlib
        monkeypatch.delattr(importlib.import_module("torch._higher_order_ops.flex_attention"), "sdpa_dense_backward")
    elif name == "nn-parallel-comm":
        from torch.nn.parallel import comm
        monkeypatch.delattr(comm, "scatter")
    else:
        raise AssertionError(f"no test takes away the target of patch {name!r}")


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_check_names_the_patch_whose_target_is_missing(monkeypatch, name):
    _missing(monkeypatch, name)
    with pytest.raises(TorchPatchError, match=f"patch '{name}': .*(no longer|expected)"):
        _torch_patches.check(name)


def test_check_fails_when_the_target_behaves_differently(monkeypatch):
    from torch._inductor import ir, scheduler

    monkeypatch.setattr(ir, "is_cpu", lambda x: True)
    with pytest.raises(TorchPatchError, match="patch 'inductor-is-cpu': .*ir.is_cpu"):
        _torch_patches.check("inductor-is-cpu")
    monkeypatch.undo()
    monkeypatch.setattr(scheduler.BaseSchedulerNode, "is_cpu", lambda self: self.node.device.type == "cpu")
    with pytest.raises(TorchPatchError, match="patch 'inductor-is-cpu': .*get_device"):
        _torch_patches.check("inductor-is-cpu")


def test_parallel_comm_check_notices_a_changed_pytorch(monkeypatch):
    import importlib

    from torch.nn.parallel import comm
    replicate = importlib.import_module("torch.nn.parallel.replicate")  # the module (the package exports a function)

    def gather(tensors, dim=0, destination=None, *, out=None):  # a comm.gather that no longer needs the patch
        return torch.cat(list(tensors), dim)

    monkeypatch.setattr(comm, "gather", gather)
    with pytest.raises(TorchPatchError, match=r"patch 'nn-parallel-comm': .*gather no longer calls torch\._C\._gather"):
        _torch_patches.check("nn-parallel-comm")
    monkeypatch.undo()
    # replicate reaching broadcast_coalesced by a name of its own would bypass the rebinding
    real = _torch_patches._source
    monkeypatch.setattr(_torch_patches, "_source", lambda name, obj, where: real(name, obj, where).replace(
        "comm.broadcast_coalesced(", "broadcast_coalesced(") if obj is replicate else real(name, obj, where))
    with pytest.raises(TorchPatchError, match="replicate no longer calls comm.broadcast_coalesced by module attribute"):
        _torch_patches.check("nn-parallel-comm")


def test_parallel_comm_keeps_pytorchs_functions_for_other_devices(monkeypatch):
    from torch.nn.parallel import comm
    from torchneuron import parallel_comm

    assert all(hasattr(getattr(comm, f), "_torchneuron_original") for f in ("broadcast", "broadcast_coalesced",
                                                                            "scatter", "gather"))
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cuda"))
    assert not parallel_comm.handles([torch.ones(2)])  # host tensors mean CUDA devices then
    assert parallel_comm.handles([torch.ones(2, device="neuron")])


def test_flex_checks_notice_a_changed_pytorch(monkeypatch):
    from torch._inductor import lowering
    from torch.nn.attention import flex_attention

    def accepts_every_device(query, key, value):
        return None

    monkeypatch.setattr(flex_attention, "_validate_device", accepts_every_device)
    with pytest.raises(TorchPatchError, match="patch 'flex-device': .*may be unnecessary now"):
        _torch_patches.check("flex-device")
    monkeypatch.undo()
    monkeypatch.setitem(lowering.lowerings, torch.ops.higher_order.flex_attention, lambda *args: None)
    with pytest.raises(TorchPatchError, match="patch 'inductor-flex-cpu-template': .*no longer is the lowering"):
        _torch_patches.check("inductor-flex-cpu-template")


def test_flex_patches_answer_for_neuron_only():
    from torch._inductor import compile_fx, lowering
    from torch._inductor.fx_passes import post_grad
    from torch.nn.attention import flex_attention

    neuron, cpu = torch.empty(1, 1, 1, 1, device="neuron"), torch.empty(1, 1, 1, 1)
    assert flex_attention._validate_device(neuron, neuron, neuron) is None
    with pytest.raises(ValueError, match="only supported on"):
        flex_attention._validate_device(neuron.to("meta"), neuron.to("meta"), neuron.to("meta"))
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_attention._validate_device(cpu.requires_grad_(), cpu, cpu)
    assert hasattr(lowering.lowerings[torch.ops.higher_order.flex_attention], "_torchneuron_original")
    assert compile_fx.post_grad_passes is post_grad.post_grad_passes
    assert hasattr(post_grad.post_grad_passes, "_torchneuron_original")


def test_changed_signature_is_reported(monkeypatch):
    from torch._inductor import utils

    monkeypatch.setattr(utils, "get_current_backend", lambda device=None: "cpp")
    with pytest.raises(TorchPatchError, match="patch 'inductor-current-backend': .*device_type"):
        _torch_patches.check("inductor-current-backend")


def test_failed_check_in_inductors_hook_is_warned(monkeypatch):
    # Inductor's init_backend_registration swallows a RuntimeError from the hook
    from torch._inductor import ir

    monkeypatch.setattr(torchneuron.compile.registration, "_registered", False)
    monkeypatch.setattr(_torch_patches, "_checked", set())
    monkeypatch.delattr(ir, "is_cpu")
    with pytest.warns(UserWarning, match="patch 'inductor-is-cpu'"), pytest.raises(TorchPatchError):
        torch.neuron.Scheduling


def _torch_names(tree: ast.Module) -> set[str]:
    """Names a module binds to torch or to something imported from torch."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "torch"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            names |= {a.asname or a.name for a in node.names}
    return names


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


# Dynamo's compile-worker caches of a device interface, which each interface
# fills for its own device type (as torch's CUDA interface does)
_DEVICE_INTERFACE_PROTOCOL = {"caching_worker_current_devices", "caching_worker_device_properties"}
# Dynamo's metric stores, where each backend counts and times under its own key (as Inductor does under
# "inductor"); the neuron backend's compilation metrics write there as TorchNeuron's do (compile/metrics.py)
_DYNAMO_METRICS = {"counters", "compilation_time_metrics", "cumulative_time_spent_ns"}


def _changes_to_torch(package: pathlib.Path) -> list[str]:
    """``file:line`` of every assignment (or ``setattr``) into something a module
    imported from torch, and every read of Dynamo's private backend registry,
    outside the patch module."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "_torch_patches.py":
            continue
        tree = ast.parse(path.read_text())
        torch_names = _torch_names(tree) - _DEVICE_INTERFACE_PROTOCOL - _DYNAMO_METRICS
        where = path.relative_to(package.parent)
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
                targets = node.args[:1]
            for t in targets:
                if isinstance(t, (ast.Attribute, ast.Subscript)) and _root(t) in torch_names:
                    found.append(f"{where}:{node.lineno}")
            if isinstance(node, ast.Name) and node.id in ("_BACKENDS", "_COMPILER_FNS"):
                found.append(f"{where}:{node.lineno} (Dynamo's private registry)")
    return found


def test_no_module_outside_the_patch_module_changes_torch():
    assert _changes_to_torch(PACKAGE) == []


def test_default_backend_compiles_for_neuron_without_naming_it():
    # A fresh process with autoload: nothing names the neuron backend, and
    # Inductor's code generation is not imported before something compiles.
    r = run_python("""
        import sys
        import torch
        assert "torch._inductor.codegen.common" not in sys.modules

        def f(x):
            return torch.sin(x) * 2 + x.relu()

        x = torch.randn(4, device="neuron")
        y = torch.compile(f)(x)
        assert y.device.type == "neuron"
        torch.testing.assert_close(y.cpu(), f(x).cpu())
        from torch._inductor.codegen.common import get_scheduling_for_device
        assert get_scheduling_for_device("neuron") is not None
        print("ok")
    """, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("ok")
