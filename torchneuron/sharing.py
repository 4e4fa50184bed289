"""Neuron tensors through ``torch.multiprocessing``, as CUDA tensors go.

A neuron tensor put on a ``torch.multiprocessing`` queue (or passed to a
spawned process) reaches the receiver as a neuron tensor over the *same*
device memory, not a copy: the sender's device segment moves into a shared
memory object (``_C._share_neuron_storage``, which first synchronises the
device, so the receiver sees every write queued before the send), and the
receiver maps it as memory of its device of the same index. Writes on either
side are seen by the other once the writer has synchronised.

As for CUDA tensors, the sender must keep the tensor alive while a receiver
uses it: the sender's allocator may reuse freed memory. Receiving the same
storage twice gives one storage, while the first is alive.
"""
from __future__ import annotations

import multiprocessing.reduction
import os

import torch
from torch.multiprocessing import reductions

from . import _C

# The storages received, by shared memory object and place, while alive.
_received: dict[tuple, reductions.StorageWeakRef] = {}


def _rebuild_neuron_storage(df, segment_bytes: int, offset: int, nbytes: int, device: int, key: tuple):
    fd = df.detach()
    try:
        ref = _received.get(key)
        if ref is not None and not ref.expired():
            return torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
        for k in [k for k, r in _received.items() if r.expired()]:
            del _received[k]
        storage = _C._neuron_storage_from_shared(fd, segment_bytes, offset, nbytes, device)
        _received[key] = reductions.StorageWeakRef(storage)
        return storage
    finally:
        os.close(fd)


def _rebuild_empty_neuron_storage(device: int):
    return torch.UntypedStorage(0, device=torch.device("neuron", device))


def reduce_storage(storage: torch.UntypedStorage, reduce_other):
    """The pickled form of a neuron storage; other storages go to ``reduce_other`` (PyTorch's)."""
    if storage.device.type != "neuron":
        return reduce_other(storage)
    if storage.nbytes() == 0:
        return (_rebuild_empty_neuron_storage, (storage.device.index,))
    fd, segment_bytes, offset = _C._share_neuron_storage(storage)
    st = os.fstat(fd)
    key = ("neuron", st.st_dev, st.st_ino, offset, storage.nbytes())
    return (_rebuild_neuron_storage,
            (multiprocessing.reduction.DupFd(fd), segment_bytes, offset, storage.nbytes(), storage.device.index, key))
