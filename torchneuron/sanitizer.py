"""``torchneuron.sanitizer``, the documented name of the stream sanitizer
(torchneuron/sanitizers/stream.py): the same module object under both names."""
import sys

from .sanitizers import stream

sys.modules[__name__] = stream
