"""``nki.compiler.frontend``: the trace-time front end, answered by running the kernel once.

AWS's compiler front end turns a kernel into MLIR for given inputs; the NKI
Library's trace-only tests call it (``ParserFrontend().compile(kernel,
inputs=..., target=..., lnc=...)``) to check that a kernel traces for a
configuration, or that it refuses a bad one.  Here ``compile`` runs the
kernel on the emulator with those inputs, which executes every trace-time
check the kernel and the emulator make (the kernel's own assertions, tile
limits, memory capacity), and returns a ``TraceResult``; nothing is compiled.
"""
from __future__ import annotations

from .jit import Kernel, run_on_host_buffers
from .machine import resolve_machine


class TraceResult:
    """What ``compile`` returns: the kernel's outputs from the run (there is no MLIR module)."""

    module = None

    def __init__(self, outputs):
        self.outputs = outputs


class NKIFrontend:
    """Base of the front ends: ``compile(kernel, inputs=..., target=..., lnc=...)`` runs the kernel."""

    def compile(self, kernel, inputs=None, target=None, lnc=1, **options):
        k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
        lnc = int(lnc or 1)
        grid = (lnc,) if lnc > 1 else ()
        machine = resolve_machine(target) if target is not None else k.target
        outputs = run_on_host_buffers(k.fn, grid, (), dict(inputs or {}), target=machine, debug=k.debug,
                                      kernel_name=k.fn.__name__, cache=k._traces)
        return TraceResult(outputs)


class ParserFrontend(NKIFrontend):
    """The front end that reads the kernel's source upstream; here, as every front end, a run."""


class TracerFrontend(NKIFrontend):
    """The front end that traces the kernel's Python upstream; here, as every front end, a run."""
