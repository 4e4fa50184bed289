"""The upstream import names, opt-in, so kernels written against them run unchanged.

``torchneuron.nki.install_import_aliases()`` enters this package in
``sys.modules`` under the names ``neuronxcc.nki`` (beta 1) and ``nki``
(NKI 0.x), with their ``language``, ``isa``, ``typing`` and ``compiler``
submodules. It refuses to shadow a real installation unless ``force=True``.
Only module names of this package are added; PyTorch is not involved.
"""
from __future__ import annotations

import sys
import types

_ROOTS = ("neuronxcc.nki", "nki")


def _typing_module():
    mod = types.ModuleType("torchneuron.nki.typing")

    class _TensorType:
        """``nt.tensor[shape, dtype]`` annotations: accepted, not checked."""

        def __getitem__(self, item):
            return self

        def __call__(self, *a, **k):
            return self

    mod.tensor = _TensorType()
    mod.mutable_tensor = mod.tensor
    mod.scalar = mod.tensor
    return mod


def install_import_aliases(force: bool = False):
    """Make ``import neuronxcc.nki.language as nl`` / ``import nki.isa as nisa`` load this emulator."""
    from . import compiler, isa, language
    pkg = sys.modules["torchneuron.nki"]
    extras = {"typing": _typing_module(), "compiler": compiler}
    for name, mod in extras.items():
        sys.modules.setdefault(f"torchneuron.nki.{name}", mod)
        setattr(pkg, name, sys.modules[f"torchneuron.nki.{name}"])
    for root in _ROOTS:
        existing = sys.modules.get(root)
        if existing is not None and existing is not pkg and not force:
            raise ImportError(f"module {root!r} is already imported from {getattr(existing, '__file__', '?')}; "
                              f"pass force=True to replace it")
        sys.modules[root] = pkg
        sys.modules[root + ".language"] = language
        sys.modules[root + ".isa"] = isa
        for name in extras:
            sys.modules[f"{root}.{name}"] = sys.modules[f"torchneuron.nki.{name}"]
    if "neuronxcc" not in sys.modules or force:
        parent = types.ModuleType("neuronxcc")
        parent.nki = pkg
        parent.__path__ = []  # a package, so submodule imports resolve via sys.modules
        sys.modules["neuronxcc"] = parent
    return pkg


def uninstall_import_aliases():
    """Remove the import names entered by install_import_aliases()."""
    pkg = sys.modules.get("torchneuron.nki")
    for key in list(sys.modules):
        if key == "neuronxcc" or any(key == r or key.startswith(r + ".") for r in _ROOTS):
            if sys.modules[key] is pkg or key.split(".")[-1] in ("language", "isa", "typing", "compiler") \
                    or key == "neuronxcc":
                del sys.modules[key]
