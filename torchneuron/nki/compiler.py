"""nki.compiler: compiler directives and direct-allocation buffers.

Direct allocation (``nki.compiler.sbuf.mod_alloc(base_addr=...)``) fixes where
a tensor lives in SBUF/PSUM on the device.  The emulator keeps every tensor
in its own storage, so a placement spec only selects the memory (SBUF or
PSUM); capacity is still accounted.  Overlapping placements that the device
would alias are NOT aliased here.  Scheduling directives are no-ops: the
emulator executes instructions in program order.
"""
from __future__ import annotations

from .machine import Buffer


class AllocSpec:
    """A direct-allocation buffer argument for ``nl.ndarray(..., buffer=...)``."""

    def __init__(self, buffer: Buffer, **placement):
        self.buffer = buffer
        self.placement = placement

    def __repr__(self):
        return f"{self.buffer.value}.alloc({self.placement})"


class _Memory:
    def __init__(self, buffer: Buffer):
        self._buffer = buffer

    def mod_alloc(self, *args, **kwargs):
        return AllocSpec(self._buffer, **kwargs)

    def alloc(self, *args, **kwargs):
        return AllocSpec(self._buffer, **kwargs)

    def auto_alloc(self, *args, **kwargs):
        return AllocSpec(self._buffer, **kwargs)


sbuf = _Memory(Buffer.sbuf)
psum = _Memory(Buffer.psum)


def _passthrough_decorator(fn=None, **kwargs):
    """Decorators that steer the real compiler; the kernel runs as written."""
    if fn is None:
        return lambda f: f
    return fn


skip_middle_end_transformations = _passthrough_decorator
enable_stack_allocator = _passthrough_decorator
force_auto_alloc = _passthrough_decorator


def no_reorder(*args, **kwargs):
    """Loop directive; iterations already run in order."""
    return None
