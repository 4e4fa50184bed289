"""``nki``: the import name TorchNeuron programs use for the NKI kernel language
(``import nki``, ``import nki.language as nl``), answered by torchneuron's NKI
emulator (:mod:`torchneuron.nki`). This module puts that package in its place;
its submodules resolve there too (torchneuron/nki/import_names.py). An ``nki``
installed ahead of this one on the path is imported instead."""
import sys

import torchneuron.nki as _nki

sys.modules[__name__] = _nki
