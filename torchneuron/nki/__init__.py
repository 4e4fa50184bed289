"""torchneuron.nki: the NKI kernel language on an emulated NeuronCore.

    import torchneuron.nki as nki
    import torchneuron.nki.language as nl
    import torchneuron.nki.isa as nisa

Kernels decorated with ``@nki.jit`` run standalone when called with NumPy
arrays, and as device tasks on the current stream when called with
``neuron`` tensors; ``nki_op`` makes a kernel a PyTorch custom operator.
See docs/nki.md.  The emulator itself runs on NumPy only; the torch side
(``torch_bridge``, behind ``nki_op``) loads on first use.
"""
from . import compiler, isa, language, typing  # noqa: F401  (submodules are part of the API)
from .bench import baremetal, benchmark, profile
from .import_names import answer_nki_when_not_installed, install_import_aliases, uninstall_import_aliases
from .errors import NKIError, NKILimitError, NKIOutOfBoundsError, NKITypeError
from .jit import Kernel, jit, register_adapter, run_on_host_buffers, simulate, simulate_kernel
from .machine import MACHINES, TARGETS, Buffer, Machine, TileSize, get_machine, set_machine
from .perf import estimate, timeline
from .tensor import NkiTensor

# ``import nki``, as TorchNeuron programs write it, finds this package when no nki is installed.
answer_nki_when_not_installed()

# upstream's beta-1 name of the tensor type (``def kernel(x: nki.tensor)``)
tensor = NkiTensor
# NKI 0.x's dtype module (``import nki.dtype as nt; nt.float8_e4m3``), also what kernels annotate
# dtype parameters with (``def kernel(x, dtype: nki.dtype = nl.bfloat16)``)
from . import dtypes as dtype  # noqa: E402


__all__ = [
    "jit", "baremetal", "benchmark", "profile", "simulate", "simulate_kernel", "Kernel", "run_on_host_buffers",
    "register_adapter", "install_import_aliases", "uninstall_import_aliases",
    "estimate", "timeline", "set_machine", "get_machine", "MACHINES", "Machine",
    "NKIError", "NKILimitError", "NKIOutOfBoundsError", "NKITypeError",
    "NkiTensor", "tensor", "dtype", "Buffer", "TileSize", "TARGETS", "language", "isa", "compiler", "typing", "nki_op",
]


def __getattr__(name):
    # torch-dependent names load the bridge lazily
    if name in ("nki_op", "torch_bridge"):
        import importlib
        torch_bridge = importlib.import_module(__name__ + ".torch_bridge")
        return torch_bridge if name == "torch_bridge" else torch_bridge.nki_op
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
