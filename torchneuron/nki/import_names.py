"""The upstream import names, opt-in, so kernels written against them run unchanged.

``torchneuron.nki.install_import_aliases()`` enters this package in
``sys.modules`` under the names ``neuronxcc.nki`` (beta 1) and ``nki``
(NKI 0.x), with their ``language``, ``isa``, ``typing`` and ``compiler``
submodules, and ``torch_xla`` (``torch_xla.core.xla_model``): the device the
PyTorch drivers of published kernels ask XLA for is ``neuron``.  It refuses
to shadow a real installation unless ``force=True``.  Only module objects
are added; torch is imported when a ``torch_xla`` function is first called.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

from . import collectives, compiler, isa, language, typing

_ROOTS = ("neuronxcc.nki", "nki")
_SUBMODULES = ("language", "isa", "typing", "compiler", "collectives")
# module names below the package that name another of its modules (nki.isa.constants holds the enumerations)
_NESTED = {"isa.constants": "isa_constants", "language.dtypes": "dtypes", "compiler.frontend": "frontend"}
# module names directly below the package that name another of its modules
_ALIASED = {"dtype": "dtypes"}


def _enter_nested(root, sub):
    """Enter the modules nested below ``root.sub`` (``nki.isa.constants``) in ``sys.modules``: their
    parents are plain modules, which the import system cannot search for submodules."""
    for key, target in _NESTED.items():
        if key.startswith(sub + "."):
            module = importlib.import_module("torchneuron.nki." + target)
            sys.modules[f"{root}.{key}"] = module
            # ``import nki.isa.constants as c`` reads the attribute of the parent module
            setattr(importlib.import_module("torchneuron.nki." + sub), key.split(".")[-1], module)
_XLA = ("torch_xla", "torch_xla.core", "torch_xla.core.xla_model")


def _neuron_device(n=None, devkind=None):
    import torch  # the emulator itself runs on NumPy: torch loads when a driver asks for the device
    return torch.device("neuron", torch.neuron.current_device() if n is None else int(n))


def _synchronize(*args, **kwargs):
    import torch  # (as in _neuron_device)
    torch.neuron.synchronize()


def _devices(devkind=None, max_devices=None):
    import torch  # (as in _neuron_device)
    n = torch.neuron.device_count()
    names = [f"neuron:{i}" for i in range(n)]
    return names[:max_devices] if max_devices else names


def _xla_modules():
    """``torch_xla`` with what the drivers of published NKI kernels use, answered by the neuron device.

    ``xla_device()``/``torch_xla.device()`` return ``neuron`` devices;
    ``mark_step()`` (and ``torch_xla.sync()``, ``wait_device_ops()``) wait
    for the device's queued work, the closest eager counterpart of cutting
    and running an XLA graph.
    """
    xm = types.ModuleType("torch_xla.core.xla_model")
    xm.__doc__ = "torch_xla.core.xla_model answered by torchneuron's neuron device (install_import_aliases)."
    xm.xla_device = _neuron_device
    xm.mark_step = _synchronize
    xm.wait_device_ops = _synchronize
    xm.get_xla_supported_devices = _devices
    xm.xla_device_hw = lambda device=None: "NEURON"
    xm.xrt_world_size = lambda *a, **k: 1
    xm.world_size = lambda *a, **k: 1
    xm.get_ordinal = lambda *a, **k: 0
    xm.is_master_ordinal = lambda *a, **k: True
    core = types.ModuleType("torch_xla.core")
    core.__path__ = []
    core.xla_model = xm
    root = types.ModuleType("torch_xla")
    root.__doc__ = "torch_xla as seen by NKI kernel drivers: the neuron device (torchneuron.nki.install_import_aliases)."
    root.__path__ = []
    root.core = core
    root.device = _neuron_device
    root.sync = _synchronize
    root.devices = _devices
    return {"torch_xla": root, "torch_xla.core": core, "torch_xla.core.xla_model": xm}


def _real_module(name):
    """Is ``name`` importable from an installation (not from our aliases)?"""
    if name in sys.modules:
        mod = sys.modules[name]
        return not getattr(mod, "_torchneuron_alias", False)
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def install_import_aliases(force: bool = False, torch_xla: bool = True):
    """Make ``import neuronxcc.nki.language as nl`` / ``import nki.isa as nisa`` load this emulator,
    and (``torch_xla=True``) ``from torch_xla.core import xla_model as xm`` give the neuron device."""
    pkg = sys.modules["torchneuron.nki"]
    subs = {"language": language, "isa": isa, "typing": typing, "compiler": compiler, "collectives": collectives}
    for root in _ROOTS:
        existing = sys.modules.get(root)
        if existing is not None and existing is not pkg and not force:
            raise ImportError(f"module {root!r} is already imported from {getattr(existing, '__file__', '?')}; "
                              f"pass force=True to replace it")
        sys.modules[root] = pkg
        for name, mod in subs.items():
            sys.modules[f"{root}.{name}"] = mod
            _enter_nested(root, name)
    if "neuronxcc" not in sys.modules or force:
        parent = types.ModuleType("neuronxcc")
        parent.nki = pkg
        parent.__path__ = []  # a package, so submodule imports resolve via sys.modules
        parent._torchneuron_alias = True
        sys.modules["neuronxcc"] = parent
    if torch_xla:
        if _real_module("torch_xla") and not force:
            raise ImportError("a torch_xla installation exists; pass torch_xla=False to keep it, or force=True "
                              "to answer its name with the neuron device")
        for name, mod in _xla_modules().items():
            mod._torchneuron_alias = True
            sys.modules[name] = mod
    return pkg


def uninstall_import_aliases():
    """Remove the import names entered by install_import_aliases()."""
    pkg = sys.modules.get("torchneuron.nki")
    for key in list(sys.modules):
        mod = sys.modules[key]
        if key == "neuronxcc" or any(key == r or key.startswith(r + ".") for r in _ROOTS):
            nested = any(key == f"{r}.{n}" for r in _ROOTS for n in _NESTED)
            if mod is pkg or key.split(".")[-1] in _SUBMODULES or nested or getattr(mod, "_torchneuron_alias", False):
                del sys.modules[key]
        elif key in _XLA and getattr(mod, "_torchneuron_alias", False):
            del sys.modules[key]


class _NkiFinder:
    """Answers ``import nki`` (and its submodules) with this emulator when no installed
    ``nki`` exists. TorchNeuron programs import ``nki`` (AWS's package, a dependency of
    TorchNeuron); here it never shadows a real one. Submodules are answered too, so that
    ``nki.language`` is this package's module, not a second copy loaded from its path."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "nki":
            installed = importlib.machinery.PathFinder.find_spec(name)
            if installed is not None and installed.loader is not None:
                return None  # an installed nki (a bare directory named nki, a namespace package, is not one)
            module = sys.modules["torchneuron.nki"]
        elif name.startswith("nki.") and (name[4:] in _SUBMODULES or name[4:] in _ALIASED) and sys.modules.get(
                "nki") is sys.modules.get("torchneuron.nki"):
            module = importlib.import_module("torchneuron.nki." + _ALIASED.get(name[4:], name[4:]))
            _enter_nested("nki", name[4:])
        else:
            return None
        return importlib.util.spec_from_loader(name, _Existing(module), is_package=name == "nki")


class _Existing:
    """A loader whose module is one already imported under its own name; it keeps that
    module's own name, spec and paths (the import system sets the alias's while loading)."""

    _ATTRS = ("__name__", "__spec__", "__loader__", "__package__", "__path__", "__file__", "__cached__")

    def __init__(self, module):
        self.module = module
        self.attrs = {a: getattr(module, a) for a in self._ATTRS if hasattr(module, a)}

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        for a, v in self.attrs.items():
            setattr(module, a, v)


def answer_nki_when_not_installed() -> None:
    """Puts the finder of the name ``nki`` first in ``sys.meta_path`` (idempotent)."""
    if _NkiFinder not in sys.meta_path:
        sys.meta_path.insert(0, _NkiFinder)
