"""The typed storage classes of ``neuron`` tensors (``torch.neuron.FloatStorage``
and the others), as ``torch.cuda`` has them for CUDA.

``Tensor.storage_type()`` and ``TypedStorage``'s legacy-class lookup find a
PrivateUse1 device's classes by name on its device module; the classes'
constructors and ``isinstance`` take the device from the module a class
says it lives in, so each class names ``torch.neuron``. Quantized dtypes
have none: ``neuron`` tensors are never quantized (CUDA has none either).
"""
import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _dtype_to_storage_type_map, _warn_typed_storage_removal


class _NeuronLegacyStorage(_LegacyStorage):
    """What a storage in device memory cannot be made from (host buffers and
    files); the rest is TypedStorage's."""

    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: a neuron storage cannot wrap a host buffer; "
                           "make a CPU storage and move it with .neuron()")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: not available for neuron storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: not available for neuron storage (device memory is not a file)")


def _storage_class(name: str, dtype: torch.dtype) -> type:
    def public_dtype(cls):
        _warn_typed_storage_removal()
        return dtype

    namespace = {
        "__module__": "torch.neuron",
        "__qualname__": name,
        "__doc__": f"Typed storage of {dtype} in neuron device memory (deprecated, as every TypedStorage).",
        "dtype": classproperty(public_dtype),
        "_dtype": classproperty(lambda cls: dtype),
    }
    return type(_NeuronLegacyStorage)(name, (_NeuronLegacyStorage,), namespace)


def storage_classes() -> dict[str, type]:
    """Name -> class, one per dtype with a legacy storage name, quantized ones aside."""
    quantized = {torch.qint8, torch.qint32, torch.quint8, torch.quint4x2, torch.quint2x4}
    return {name: _storage_class(name, dtype) for dtype, name in _dtype_to_storage_type_map().items()
            if dtype not in quantized}
