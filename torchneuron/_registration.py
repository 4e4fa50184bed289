"""Makes ``neuron`` a PyTorch device: the backend name, ``torch.neuron``, and
the generated ``Tensor.neuron()`` / ``Module.neuron()`` / storage methods."""
import atexit

import torch


def _drain_at_exit():
    """Lets queued device work finish before the interpreter tears down the
    libraries that work runs in; errors no one can read any more are dropped."""
    from . import device

    if device.is_initialized():
        for i in range(device.device_count()):
            try:
                device.synchronize(i)
            except RuntimeError:
                pass


def register():
    if getattr(torch, "neuron", None) is not None:
        return
    torch.utils.rename_privateuse1_backend("neuron")
    from . import device as device_module

    torch._register_device_module("neuron", device_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    atexit.register(_drain_at_exit)
