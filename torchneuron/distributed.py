"""``torch.distributed``'s ``neuron`` backend.

Registered at import: ``init_process_group()`` on a machine whose
accelerator is ``neuron``, ``init_process_group("neuron")`` and
``init_process_group("cpu:gloo,neuron:neuron")`` all give collectives on
``neuron`` tensors. Underneath, each group owns a gloo backend that runs on
host views of device memory (csrc/bridge/distributed/process_group.h), so a
collective copies nothing.
"""
from __future__ import annotations

import os

import torch.distributed as dist

from . import _C, _torch_patches


def _create_backend(options, _backend_options=None):
    # torchrun's restarts keep the rendezvous store and its keys: without the
    # attempt in the prefix, gloo would connect to the dead workers' addresses
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"neuron/attempt{attempt}/", options.store)
    # gloo's threads run the collectives on device memory: they start with device access
    gloo = _C._with_device_access(
        lambda: dist.ProcessGroupGloo(store, options.group_rank, options.group_size, options.timeout))
    return _C._NeuronBackend(gloo, options.group_rank, options.group_size, options.timeout)


class _GlooOptions(dist.ProcessGroupGloo._Options):
    """A neuron group's options: its gloo backend's, with the deep copy that
    split_group makes of a parent's options for each subgroup (gloo's own
    Python type has none)."""

    @classmethod
    def like(cls, options) -> "_GlooOptions":
        copy = cls()
        for field in ("_timeout", "_threads", "_devices", "group_name", "global_ranks_in_group"):
            setattr(copy, field, getattr(options, field))
        return copy

    def __deepcopy__(self, memo):
        return _GlooOptions.like(self)


def register() -> None:
    if not dist.is_available() or "neuron" in dist.Backend.backend_list:
        return
    # devices is a list: a string would be taken character by character.
    dist.Backend.register_backend("neuron", _create_backend, extended_api=True, devices=["neuron"])
    # what split_group (and so a device mesh's sub-groups) copies, as NCCL's backend has it
    _C._NeuronBackend.options = property(lambda backend: _GlooOptions.like(backend._gloo_options))
    # a group of the neuron backend names it as its default (what DDP's logger looks up)
    _torch_patches.apply("c10d-default-backend")
    # monitored_barrier on such a group: PyTorch allows gloo alone, the neuron backend's is gloo's
    _torch_patches.apply("c10d-monitored-barrier")
