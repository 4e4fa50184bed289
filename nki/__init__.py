"""``nki``: the import name TorchNeuron programs use for the NKI kernel language
(``import nki``, ``import nki.language as nl``), answered by torchneuron's NKI
emulator (:mod:`torchneuron.nki`). This module puts that package in its place;
its submodules resolve there too (torchneuron/nki/import_names.py).

Another ``nki`` anywhere on ``sys.path`` (AWS's package) is imported instead:
an editable install finds this module before the path is searched, so the
path is searched here, without this module's own directory."""
import importlib.machinery
import importlib.util
import os
import sys

_home = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.machinery.PathFinder.find_spec(
    __name__, [p for p in sys.path if os.path.abspath(p or os.curdir) != _home])
if _spec is not None and _spec.loader is not None:  # a bare directory named nki (a namespace package) is not one
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[__name__] = _module
    _spec.loader.exec_module(_module)
else:
    import torchneuron.nki as _nki

    sys.modules[__name__] = _nki
