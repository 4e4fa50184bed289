"""``torch.nn.parallel.comm`` for neuron tensors: what ``nn.DataParallel`` needs.

DataParallel itself is device-generic (``torch.accelerator`` picks the device
type, ``parallel_apply`` runs the replicas in threads, ``reduce_add`` sums
gradients with ordinary tensor operations), but four of ``comm``'s functions
call C++ that PyTorch builds for CUDA only: ``torch._C._broadcast``,
``_broadcast_coalesced``, ``_scatter`` and ``_gather`` (and their ``out=``
forms). The functions here do what that C++ does (torch/csrc/cuda/comm.cpp),
with the same checks and messages, for neuron tensors:

* ``broadcast``: a copy per device, the source itself on its own device;
* ``broadcast_coalesced``: tensors flattened into buffers of at most
  ``buffer_size`` bytes per dtype, each buffer broadcast and split again; the
  copies get version counters of their own (as ``.data`` gives), the first
  device's outputs are the inputs themselves;
* ``scatter``: chunks (``tensor.chunk`` or ``split`` by ``chunk_sizes``),
  each moved to its device on the stream given for it; a chunk already on its
  device stays a view;
* ``gather``: one tensor on the destination (the current neuron device by
  default, the CPU for -1) in the first input's memory format when every
  input has it, each input copied into its slice.

The patch ``nn-parallel-comm`` (_torch_patches.py) routes a call here when one
of its tensors is on neuron, or all are on the CPU and neuron is the current
accelerator (device indices then mean neuron devices, as they mean CUDA
devices to the C++ functions).
"""
from __future__ import annotations

import contextlib
from typing import Sequence

import torch
from torch._utils import _flatten_dense_tensors, _reorder_tensors_as, _take_tensors, _unflatten_dense_tensors

DEVICE = "neuron"


def _is_neuron(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == DEVICE


def handles(tensors: Sequence) -> bool:
    """Whether a comm call with these tensor arguments is neuron's."""
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    if any(_is_neuron(t) for t in tensors):
        return True
    accelerator = torch.accelerator.current_accelerator()
    return bool(tensors) and all(t.device.type == "cpu" for t in tensors) and \
        accelerator is not None and accelerator.type == DEVICE


def _device(index: int) -> torch.device:
    if index < 0:
        raise RuntimeError(f"Expected non-negative device index, but got {index}")
    return torch.device(DEVICE, index)


def _wrap_dim(dim: int, ndim: int) -> int:
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise IndexError(f"Dimension out of range (expected to be in range of [{-max(ndim, 1)}, "
                         f"{max(ndim, 1) - 1}], but got {dim})")
    return dim % max(ndim, 1)


def _suggest_memory_format(t: torch.Tensor) -> torch.memory_format:
    # ATen's suggest_memory_format for the dense tensors DataParallel gathers
    if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    if t.dim() == 5 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    return torch.contiguous_format


def _check_outputs_on_device(out: Sequence[torch.Tensor]) -> None:
    for i, o in enumerate(out):
        if not _is_neuron(o):
            raise RuntimeError(f"Expected all output tensors to be {DEVICE} tensors, but output tensor at "
                               f"index {i} has device '{o.device}'")


def broadcast(tensor: torch.Tensor, devices: Sequence[int]) -> list[torch.Tensor]:
    for d in devices:
        if d < 0:
            raise RuntimeError(f"Expected non-negative device index, but got {d}")
    return [tensor if d == tensor.get_device() else
            torch.empty(tensor.shape, dtype=tensor.dtype, device=_device(d)).copy_(tensor, non_blocking=True)
            for d in devices]


def broadcast_out(tensor: torch.Tensor, out: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    _check_outputs_on_device(out)
    for i, o in enumerate(out):
        if o.shape != tensor.shape:
            raise RuntimeError(f"Expected all output tensors to have same shape as the source tensor "
                               f"{list(tensor.shape)}, but output tensor at index {i} has shape {list(o.shape)}")
    for o in out:
        o.copy_(tensor, non_blocking=True)
    return list(out)


def broadcast_coalesced(tensors: Sequence[torch.Tensor], devices: Sequence[int],
                        buffer_size: int) -> list[list[torch.Tensor]]:
    if not devices:
        raise RuntimeError("Expected at least one device to broadcast to")
    if not all(t.get_device() == devices[0] for t in tensors):
        raise RuntimeError(f"All tensors must be on devices[0]: {devices[0]}")
    outputs: list[list[torch.Tensor]] = [list(tensors)] + [[] for _ in devices[1:]]
    for chunk in _take_tensors(list(tensors), buffer_size):
        if any(t.is_sparse for t in chunk):
            raise RuntimeError(f"broadcast_coalesced: sparse tensors cannot be on {DEVICE}")
        copies = broadcast(_flatten_dense_tensors(chunk), devices)
        for i in range(1, len(devices)):
            # each output its own version counter: they share no storage once split
            outputs[i].extend(t.data for t in _unflatten_dense_tensors(copies[i], chunk))
    for i in range(1, len(devices)):
        outputs[i] = list(_reorder_tensors_as(outputs[i], tensors))
    return outputs


def _stream_for(streams, i: int, device: int):
    stream = streams[i] if streams is not None and i < len(streams) else None
    if stream is None:
        return contextlib.nullcontext()
    if stream.device_index != device:
        raise RuntimeError(f"Expected the device associated with the stream at index {i} (was "
                           f"{stream.device_index}) to match the device supplied at that index (expected {device})")
    return stream


def scatter(tensor: torch.Tensor, devices: Sequence[int], chunk_sizes, dim: int, streams) -> list[torch.Tensor]:
    if not devices:
        raise RuntimeError("Expected at least one device to scatter to")
    if chunk_sizes is not None:
        chunk_sizes = list(chunk_sizes)
        if len(chunk_sizes) != len(devices):
            raise RuntimeError(f"Expected devices and chunk_sizes to be of same length, but got len(devices) = "
                               f"{len(devices)} and len(chunk_sizes) = {len(chunk_sizes)}")
    dim = _wrap_dim(dim, tensor.dim())
    chunks = list(tensor.split_with_sizes(chunk_sizes, dim) if chunk_sizes is not None
                  else tensor.chunk(len(devices), dim))
    for i, chunk in enumerate(chunks):
        d = devices[i]
        if d != tensor.get_device():
            with _stream_for(streams, i, d):
                chunks[i] = chunk.to(_device(d), non_blocking=True, copy=False, memory_format=torch.preserve_format)
    return chunks


def scatter_out(tensor: torch.Tensor, out: Sequence[torch.Tensor], dim: int, streams) -> list[torch.Tensor]:
    if not out:
        raise RuntimeError("Expected at least one output tensor to scatter to")
    dim = _wrap_dim(dim, tensor.dim())
    _check_outputs_on_device(out)
    sizes = []
    for i, o in enumerate(out):
        shape = list(o.shape)
        same = len(shape) == tensor.dim()
        if same:
            sizes.append(shape[dim])
            shape[dim] = tensor.size(dim)
        if not same or shape != list(tensor.shape):
            raise RuntimeError(f"Output tensor at index {i} has incorrect shape: {list(o.shape)}. Expected same "
                               f"shape except for scatter dim {dim} as the source tensor: {list(tensor.shape)}")
    if sum(sizes) != tensor.size(dim):
        raise RuntimeError(f"Total size for output tensors along scatter dim {dim} does not match the source "
                           f"tensor size at dim {dim}. Expected {tensor.size(dim)}, but got total size {sum(sizes)}")
    for i, (o, chunk) in enumerate(zip(out, tensor.split_with_sizes(sizes, dim))):
        with _stream_for(streams, i, o.get_device()):
            o.copy_(chunk, non_blocking=True)
    return list(out)


def _gathered_shape(tensors: Sequence[torch.Tensor], dim: int) -> tuple[list[int], int]:
    if not tensors:
        raise RuntimeError("Expected at least one tensor to gather from")
    first = tensors[0]
    dim = _wrap_dim(dim, first.dim())
    expected = list(first.shape)
    total = 0
    for i, t in enumerate(tensors):
        if not _is_neuron(t):
            raise RuntimeError(f"Expected all input tensors to be {DEVICE} tensors, but tensor at index {i} "
                               f"has device '{t.device}'")
        if t.dim() != len(expected):
            raise RuntimeError(f"Expected all input tensors to have the same number of dimensions, but tensor at "
                               f"index {i} has {t.dim()} dimensions, (expected {len(expected)})")
        expected[dim] = t.size(dim)
        if list(t.shape) != expected:
            raise RuntimeError(f"Input tensor at index {i} has invalid shape {list(t.shape)}, but expected {expected}")
        total += t.size(dim)
    expected[dim] = total
    return expected, dim


def _gather_into(tensors: Sequence[torch.Tensor], out: torch.Tensor, dim: int) -> torch.Tensor:
    for piece, t in zip(out.split_with_sizes([t.size(dim) for t in tensors], dim), tensors):
        piece.copy_(t, non_blocking=_is_neuron(out))
    return out


def gather(tensors: Sequence[torch.Tensor], dim: int, destination: int | None) -> torch.Tensor:
    expected, dim = _gathered_shape(tensors, dim)
    formats = {_suggest_memory_format(t) for t in tensors}
    memory_format = formats.pop() if len(formats) == 1 else torch.contiguous_format
    if destination == -1:
        device = torch.device("cpu")
    else:
        device = _device(torch.neuron.current_device() if destination is None else destination)
    out = torch.empty(expected, dtype=tensors[0].dtype, device=device, memory_format=memory_format)
    return _gather_into(tensors, out, dim)


def gather_out(tensors: Sequence[torch.Tensor], out: torch.Tensor, dim: int) -> torch.Tensor:
    expected, dim = _gathered_shape(tensors, dim)
    if list(out.shape) != expected:
        raise RuntimeError(f"Expected out tensor to have shape {expected}, but got {list(out.shape)}")
    return _gather_into(tensors, out, dim)
