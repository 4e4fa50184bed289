"""Inductor's view of the ``neuron`` device.

Kernels: Inductor's C++ CPU code generator (``CppScheduling``) unchanged. The
kernels it generates take raw pointers, and a ``neuron`` tensor's
``data_ptr()`` is host-addressable device memory.

Wrapper: Inductor's Python wrapper, with one change: where the CPU wrapper
calls a C++ kernel directly, ours queues the call as a device task on the
current stream (:mod:`torchneuron.compile.launch`). Buffers are allocated with
``empty_strided(..., device='neuron')`` (the stream-ordered caching
allocator), and extern kernels (``mm``, convolutions, fallbacks) are ordinary
asynchronous ``neuron`` operators. ``neuron`` is not one of Inductor's GPU
types, so Triton is never involved; where Inductor asks "is this the CPU?" or
"which backend generates code here?", ``neuron`` answers as the CPU does
(patches ``inductor-is-cpu`` and ``inductor-current-backend``,
torchneuron/_torch_patches.py).
"""
from __future__ import annotations

import hashlib
import pathlib

from torch._inductor.codegen.common import (
    DeviceOpOverrides,
    get_scheduling_for_device,
    register_backend_for_device,
    register_device_op_overrides,
)
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.cpu_vec_isa import pick_vec_isa
from torch._inductor.virtualized import V

from .. import _torch_patches
from . import codegen_config

_LAUNCH_IMPORT = "from torchneuron.compile.launch import launch as neuron_launch"


def _neuron_launch_line(kernel_name, call_args, device) -> str | None:
    """The wrapper's line for a C++ kernel call on ``device``: ``neuron_launch(...)`` on neuron, None
    (Inductor's own line) elsewhere. A CPU kernel that reads a neuron buffer would run on the calling
    thread, before the device work that writes the buffer: refused here, by name, at compile time."""
    if device.type == "neuron":
        args = ", ".join(str(a) for a in call_args)
        return f"neuron_launch({kernel_name}, {kernel_name!r}{', ' if args else ''}{args})"
    on_device = [str(a) for a in call_args if _buffer_device_type(str(a)) == "neuron"]
    if on_device:
        raise RuntimeError(
            f"Inductor placed kernel {kernel_name} on {device} though it reads neuron buffers "
            f"({', '.join(on_device)}): it would read device memory on the host, outside stream order. "
            "This comes from an operation between CPU tensors and neuron tensors that Inductor lowers on the "
            "CPU; move the CPU tensors to neuron first (they are usually 0-dim: Python scalars).")
    return None


def _buffer_device_type(name: str) -> str | None:
    buf = V.graph.try_get_buffer(name)
    device = buf.get_device() if buf is not None and hasattr(buf, "get_device") else None
    return device.type if device is not None else None


class NeuronWrapperCodegen(PythonWrapperCodegen):
    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if is_subgraph:
            return NeuronSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return NeuronWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        self.imports.writeline(_LAUNCH_IMPORT)

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        device = device or V.graph.get_current_device_or_throw()
        line = None if triton else _neuron_launch_line(kernel_name, call_args, device)
        if line is None:
            super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)
        else:
            self.writeline(line)

    def make_allocation(self, name, device, dtype, shape, stride, allocation_shape=None, is_pinned=False):
        # Inductor writes device='neuron' (the current device) and emits no
        # device guard for non-GPU devices: name the index, so a graph on
        # neuron:1 allocates there whatever the current device is.
        line = super().make_allocation(name, device, dtype, shape, stride, allocation_shape, is_pinned)
        if device.type == "neuron" and device.index is not None:
            line = line.replace("device='neuron'", f"device='neuron:{device.index}'")
        return line


class NeuronSubgraphWrapperCodegen(SubgraphPythonWrapperCodegen):
    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        device = device or V.graph.get_current_device_or_throw()
        line = None if triton else _neuron_launch_line(kernel_name, call_args, device)
        if line is None:
            super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)
        else:
            self.imports.writeline(_LAUNCH_IMPORT)
            self.writeline(line)


class NeuronDeviceOpOverrides(DeviceOpOverrides):
    """What the wrapper writes for device management (no raw streams: kernels
    are queued on the current stream by ``neuron_launch``)."""

    def import_get_raw_stream_as(self, name: str) -> str:
        return f"def {name}(_):\n    return 0\n"

    def set_device(self, device_idx: int) -> str:
        return f"torch.neuron.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.neuron.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.neuron.device({device_idx})"

    def cpp_kernel_type(self) -> str:
        return "void*"


def _source_key() -> str:
    here = pathlib.Path(__file__).parent
    digest = hashlib.sha256()
    for path in [here.parent / "_torch_patches.py", *sorted(here.glob("*.py"))]:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def register() -> None:
    """Registers ``neuron`` with Inductor, with the patches that make Inductor
    treat it as its C++ (CPU) backend (see torchneuron/_torch_patches.py)."""
    _torch_patches.check("inductor-wrapper-overrides")
    _torch_patches.apply("inductor-is-cpu")
    _torch_patches.apply("inductor-current-backend")
    _torch_patches.apply("inductor-argreduce-logical-index")
    _torch_patches.apply("inductor-pointwise-device")
    _torch_patches.apply("inductor-scatter-fallback")
    _torch_patches.apply("inductor-layout-opt")
    _torch_patches.apply("inductor-conv-bias")
    _torch_patches.apply("inductor-flex-cpu-template")
    _torch_patches.apply("inductor-flex-dense")
    codegen_config.vec_isa = str(pick_vec_isa())  # both part of every cached graph's key
    codegen_config.source_key = _source_key()
    if get_scheduling_for_device("neuron") is None:
        register_backend_for_device("neuron", CppScheduling, NeuronWrapperCodegen,
                                    device_custom_config=codegen_config)
    register_device_op_overrides("neuron", NeuronDeviceOpOverrides())
