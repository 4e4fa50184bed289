"""Virtual registers (``nisa.register_alloc``): 32-bit integers of the engine sequencers.

A kernel loads a register from a tile (``nisa.register_load``) and uses it as a
dynamic loop bound (``nl.dynamic_range(reg)``) or a ``while reg:`` condition;
``register_move`` sets it to a constant or another register's value and
``register_store`` writes it into a tile.  The emulator runs the kernel's
Python with the register's current value, so such control flow follows the
data as the device's branches do.  A signature whose registers are loaded
from data is interpreted on every call (its instructions depend on the data).
"""
from __future__ import annotations

import numpy as np

from .errors import NKITypeError

_INT32 = np.iinfo(np.int32)


class VirtualRegister:
    """One register; its value is a Python int (wrapped to 32 bits when set)."""

    __slots__ = ("value",)

    def __init__(self, value=0):
        self.value = 0
        self.set(value)

    def set(self, value):
        if isinstance(value, VirtualRegister):
            value = value.value
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise NKITypeError(f"a register holds an integer, not {value!r}")
        self.value = int(np.int64(value).astype(np.int32))  # 32-bit, wrapping as the hardware does

    def __index__(self):
        return self.value

    __int__ = __index__

    def __bool__(self):
        return self.value != 0

    def __repr__(self):
        return f"VirtualRegister({self.value})"
