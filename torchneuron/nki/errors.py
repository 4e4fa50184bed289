"""Exceptions raised by the NKI emulator, and how they find the kernel line.

Every error a kernel author can trigger names the offending source line of the
kernel (not a line inside the emulator), because that is what the author has to
change.  We find it by walking the Python stack outwards until we leave this
package.
"""
from __future__ import annotations

import os
import sys

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def kernel_location(skip_package: bool = True) -> str:
    """Return ``file:line (in function)`` of the innermost frame outside this package."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not (skip_package and os.path.abspath(filename).startswith(_PACKAGE_DIR + os.sep)):
            return f"{filename}:{frame.f_lineno} (in {frame.f_code.co_name})"
        frame = frame.f_back
    return "<unknown location>"


class NKIError(Exception):
    """Base class of every error raised for an invalid NKI program."""

    def __init__(self, message: str, *, location: str | None = None, note: str | None = None):
        self.location = location if location is not None else kernel_location()
        self.detail = message
        self.note = note
        super().__init__(self._text())

    def _text(self):
        text = f"{self.detail} [at {self.location}]"
        return text if not self.note else f"{text}\n{self.note}"

    def relocate(self, location: str):
        """Name another kernel line (a replayed instruction's) as the error's location."""
        self.location = location
        self.args = (self._text(),)


class NKILimitError(NKIError, ValueError):
    """A hardware limit of the NeuronCore was exceeded.

    ``limit`` is the name of the limit (e.g. ``nl.tile_size.pmax``), ``value``
    what the kernel asked for and ``maximum`` what the hardware allows.
    """

    def __init__(self, limit: str, value, maximum, what: str, *, location: str | None = None,
                 note: str | None = None):
        self.limit = limit
        self.value = value
        self.maximum = maximum
        super().__init__(f"NKI limit {limit} exceeded: {what} is {value}, maximum is {maximum}",
                         location=location, note=note)


class NKIOutOfBoundsError(NKIError, IndexError):
    """An access touched elements outside the tensor it indexes."""


class NKITypeError(NKIError, TypeError):
    """An operand has the wrong kind (buffer, dtype, shape) for an instruction."""
