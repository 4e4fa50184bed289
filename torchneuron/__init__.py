"""torchneuron: an emulated AWS NeuronCore as the native PyTorch device ``neuron``.

``import torch`` is enough: PyTorch's backend autoload calls :func:`_autoload`
(entry point group ``torch.backends``). Importing this package registers the
device explicitly, for ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` setups.
"""


def _autoload():
    """Entry point of PyTorch's device-backend autoload; importing does the work.

    Defined before ``import torch``: when this package is imported first,
    torch's own import runs autoload, which looks this function up on the
    partially initialised package."""


import torch  # noqa: E402

from . import environment as _environment  # noqa: E402

# Every TORCH_NEURONX_*/NEURON_* setting at start-up: a malformed one read in Python
# fails the import, naming it; an unknown name warns (the runtime checks its own
# at the first device use).
_environment.check()

from .target import _machine_from_environment  # noqa: E402

_machine_from_environment()  # TORCHNEURON_TARGET picks the machine model before the runtime starts

from . import _C  # the C++ bridge: registers guard, hooks, allocator, kernels

_C._device_tanh()  # reads TORCHNEURON_DEVICE_TANH at start-up: a malformed value fails here, naming it
from ._registration import register as _register

_register()

from . import _torch_patches  # noqa: E402

_torch_patches.apply("set-num-threads")
_torch_patches.apply("mp-neuron-storage")
_torch_patches.apply("fake-conv-layout")
_torch_patches.apply("flex-device")
_torch_patches.apply("nn-parallel-comm")

from ._C import clear_op_tracking, get_executed_ops, get_fallback_ops, get_fused_ops  # noqa: E402
from .nki import nki_op  # noqa: E402
from . import compile as _compile  # noqa: E402,F401  (registers torch.compile's "neuron" backend)
from . import distributed as _distributed  # noqa: E402

_distributed.register()  # torch.distributed's "neuron" backend

from . import varlen as _varlen  # noqa: E402

_varlen.register()  # torch.nn.attention.varlen's operators on neuron

__all__ = ["get_executed_ops", "get_fallback_ops", "get_fused_ops", "clear_op_tracking", "nki_op"]

import os as _os  # noqa: E402

if _os.environ.get("TORCHNEURON_STREAM_SANITIZER"):  # the stream sanitizer for the whole program
    from .sanitizers import stream as _sanitizer

    _sanitizer._enable_from_environment()

if _os.environ.get("TORCHNEURON_MEMCHECK"):  # the device memory checker (docs/sanitizers.md)
    from .sanitizers import memcheck as _memcheck

    _memcheck._enable_from_environment()

from . import target as _target  # noqa: E402

_target._enable_from_environment()  # TORCHNEURON_TARGET: the Trainium twin for the whole program
