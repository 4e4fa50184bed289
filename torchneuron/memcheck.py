"""``torchneuron.memcheck``, the documented name of the device memory checker
(torchneuron/sanitizers/memcheck.py): the same module object under both names."""
import sys

from .sanitizers import memcheck

sys.modules[__name__] = memcheck
