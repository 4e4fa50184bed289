"""The instruction hook: every kernel-visible operation is marked ``instruction``, which
routes each outermost call to this thread's recorder (``recorder.Recorder``, while a
launch records its program) and liveness count (``liveness.Liveness``, while an
instance is interpreted).  It sits below the tensor and the instructions it marks;
the recorder, above them, installs itself through the thread-local state here.
"""
from __future__ import annotations

import functools
import threading
import types

from .errors import kernel_location

# rec: the recording recorder.Recorder; live: the counting liveness.Liveness (per thread)
_tls = threading.local()


def active():
    """The recorder of this thread's launch, if one is recording."""
    return getattr(_tls, "rec", None)


def outside_instruction(what: str):
    """Called where data is touched: kernel code doing it directly makes the trace unreplayable."""
    rec = getattr(_tls, "rec", None)
    if rec is not None and rec.depth == 0:
        rec.poison(f"{what} outside an instruction at {kernel_location()}")


def instruction(fn):
    """Mark a kernel-visible operation: one step of a recorded program, and one step of
    the instance's liveness count (``liveness.Liveness``) while it is interpreted."""
    @functools.wraps(fn)
    def op(*args, **kwargs):
        live = getattr(_tls, "live", None)
        rec = getattr(_tls, "rec", None)
        if live is None or live.depth:
            if rec is None or rec.depth:
                return fn(*args, **kwargs)
            return rec.call(fn, args, kwargs)
        live.depth = 1
        try:
            out = fn(*args, **kwargs) if rec is None or rec.depth else rec.call(fn, args, kwargs)
        finally:
            live.depth = 0
        live.after(fn, args, kwargs, out)
        return out
    op._nki_instruction = fn
    return op


def liveness():
    """The liveness count of the instance this thread is interpreting, or None."""
    return getattr(_tls, "live", None)


class counting:
    """Context manager: count the instructions of ``live`` (a liveness.Liveness) on this thread."""

    def __init__(self, live):
        self.live = live

    def __enter__(self):
        self.prev = getattr(_tls, "live", None)
        _tls.live = self.live
        return self.live

    def __exit__(self, *exc):
        _tls.live = self.prev
        return False


def instructions(namespace: dict, module: str, exclude=()):
    """Wrap every public function defined in ``module`` except ``exclude`` (pure helpers)."""
    for name, fn in list(namespace.items()):
        if (isinstance(fn, types.FunctionType) and not name.startswith("_") and fn.__module__ == module
                and name not in exclude and not hasattr(fn, "_nki_instruction")):
            namespace[name] = instruction(fn)
