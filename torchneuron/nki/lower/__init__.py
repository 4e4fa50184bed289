"""Lowering a recorded program into pre-bound closures (the fast replay).

A generic replay (``trace.Step.run``) calls each instruction's public
function again: argument parsing, tile objects, validation, allocation and
per-buffer bookkeeping run on every launch.  None of that depends on tile
values, so it can be done once.  ``lower(program)`` walks the recorded steps
once, simulating what the interpreter's bookkeeping would decide at each step,
and turns every step into a closure that does only the array work:

* every tile argument becomes an index into a *view table*: NumPy views built
  once over preallocated on-chip buffers (reused across replays and, by
  liveness, between tiles of the same shape and dtype), or built per launch
  over the HBM arguments and outputs;
* which value an engine reads (the float32 result kept by the instruction
  that produced a tile, or the rounded storage) is decided statically, as
  ``NkiTensor.exact_values`` decides it when interpreting; a result's rounded
  storage is written only if some later step reads it;
* dtypes, rounding functions, operators, broadcast decisions and constant
  masks are resolved when lowering.

* a bf16/fp8 tile loaded from HBM and read by a single engine instruction is
  converted straight from HBM, without the tile copy, unless HBM is written
  while it is live.

The closures perform the same NumPy operations in the same order as the
interpreter, so results are bit-identical (tests/nki/test_trace_cache.py
checks lowered and generic replays against interpretation).  Lowering covers
the common instructions of both language generations (see ``@lowering``
below) on basic, ``.ap()`` and index-grid views.  A program with any other
step (``mask=``, out-of-bounds index grids, dtype reinterpretation, random
numbers, accumulation-register reads, ...) is not lowered (``Decline``) and
replays generically.

The package, by stage: ``lowerer.py`` (the ``Lowerer``, which simulates the
interpreter's bookkeeping, and the registry of lowerings), ``program.py``
(``FastProgram``, the lowered form and its view tables), one file per
instruction family (``allocation.py``, ``movement.py``, ``arithmetic.py``,
``matmul.py``, ``engines.py``), and ``driver.py`` (``lower``, ``replay``).
"""
from .driver import fast_replay, lower, lowered, replay  # noqa: F401
