"""64-bit types as the target computes them.

Trainium's compiler lowers int64 and float64 operators to 32 bits unless told
otherwise (AWS Neuron docs: "Data Types", integer type conversion: 64-bit
integer operations are downcast to int32 by default, native int64 being a
compiler option on Trn2 and later; TorchNeuron's memory-management guide, 64-bit
dtype behavior). Two ways to see it here (``TORCHNEURON_TARGET_64BIT``):

``warn``
    Each 64-bit result on the device is checked, on the device, for a value
    the narrowing would change (an integer outside int32, a float64 that
    float32 does not hold exactly). The first such value of an operator at a
    Python line is reported once, as a :class:`TargetWarning`, when the checks
    are read: every 64 checks, and at :func:`torchneuron.target.summary`.
``narrow``
    Each 64-bit result is narrowed as the target stores it (integers wrap to
    int32, floats round to float32) and widened back, so values, overflow and
    the rest of the program follow the target; ``dtype`` still says int64 or
    float64, as TorchNeuron's tensors do.
"""
from __future__ import annotations

import os
import threading
import warnings

import torch

WIDE = {torch.int64: torch.int32, torch.float64: torch.float32}
CHECKS_PER_READ = 64


class TargetWarning(UserWarning):
    """The program would behave differently on the target (``TORCHNEURON_TARGET``)."""


def warn_at(msg: str, site: str) -> None:
    """A TargetWarning attributed to the user's line ``site`` ("file:line")."""
    filename, _, line = site.rpartition(":")
    warnings.warn_explicit(msg, TargetWarning, filename or site, int(line) if line.isdigit() else 0,
                           module=os.path.splitext(os.path.basename(filename))[0] or None)


INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def _check(t: torch.Tensor):
    """Device work that finds a value narrowing would change: (whether there is one, one
    such value), both 0-dim tensors. For int64 one reduction: the extremes."""
    if t.dtype == torch.int64:
        lo, hi = torch.aminmax(t)
        return (lo < INT32_MIN) | (hi > INT32_MAX), torch.where(hi > INT32_MAX, hi, lo)
    changed = ((t.to(torch.float32).to(torch.float64) != t) & ~torch.isnan(t)).reshape(-1)
    return changed.any(), t.reshape(-1)[changed.to(torch.uint8).argmax()]


class WideTypes:
    def __init__(self, mode: str, target: str):
        self.mode, self.target = mode, target
        self._pending = []       # (op, site, any-changed, first changed value), device tensors
        self._reported = set()   # (op, site) already reported
        self._lock = threading.Lock()
        self.narrowed = 0

    def after(self, op: str, tensors, site_of) -> None:
        """Applies the rule to an operator's 64-bit results on the device."""
        for t in tensors:
            if t.dtype not in WIDE or t.numel() == 0:
                continue
            if self.mode == "narrow":
                with torch.no_grad():
                    t.copy_(t.to(WIDE[t.dtype]))
                self.narrowed += 1
                continue
            site = site_of()
            if (op, site) in self._reported:
                continue
            with torch.no_grad():
                item = (op, site, *_check(t), t.dtype)
            with self._lock:
                self._pending.append(item)
                full = len(self._pending) >= CHECKS_PER_READ
            if full:
                self.read()

    def read(self) -> list:
        """Reads the pending checks (waits for their device work); warns for each new finding."""
        with self._lock:
            pending, self._pending = self._pending, []
        found = []
        for op, site, any_changed, first, dtype in pending:
            if (op, site) in self._reported or not bool(any_changed):
                continue
            self._reported.add((op, site))
            value = first.item()
            narrow = WIDE[dtype]
            became = torch.tensor(value, dtype=dtype).to(narrow).item()
            msg = (f"{op} at {site}: an {str(dtype).replace('torch.', '')} result holds {value!r}, which "
                   f"{self.target} computes in {str(narrow).replace('torch.', '')} as {became!r} "
                   f"(TORCHNEURON_TARGET_64BIT=narrow runs the program as the target would)")
            found.append(msg)
            warn_at(msg, site)
        return found

    @property
    def findings(self) -> int:
        return len(self._reported)
