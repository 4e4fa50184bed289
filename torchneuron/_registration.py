"""Makes ``neuron`` a PyTorch device: the backend name, ``torch.neuron``, and
the generated ``Tensor.neuron()`` / ``Module.neuron()`` / storage methods."""
import torch


def register():
    if getattr(torch, "neuron", None) is not None:
        return
    torch.utils.rename_privateuse1_backend("neuron")
    from . import device as device_module

    torch._register_device_module("neuron", device_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
