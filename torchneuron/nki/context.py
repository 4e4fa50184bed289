"""State of the kernel instance being executed (the SPMD program and its memories).

Kept thread-local so that independent launches on different host threads
(e.g. device executors running kernels from two streams) do not mix.
"""
from __future__ import annotations

import threading

import numpy as np

from .liveness import Liveness
from .machine import Machine, debug_enabled, default_target


class LaunchState:
    """What all instances of one launch share: grid, outputs, options."""

    def __init__(self, grid=(), *, target: Machine | None = None, debug: bool | None = None,
                 hbm_allocator=None, kernel_name: str = "<no kernel>"):
        self.grid = tuple(grid)
        self.target = target or default_target()
        self.debug = debug_enabled() if debug is None else debug
        # Creates the storage of shared_hbm outputs.  The torch bridge passes an
        # allocator returning aliases of device memory; standalone it is NumPy.
        self.hbm_allocator = hbm_allocator
        self.kernel_name = kernel_name
        self.shared_outputs: list = []
        # False when replaying a recorded program (capacity was checked when recording)
        self.account_memory = True
        # recorder.Recorder collecting the instructions for the performance model, or None
        self.profile = None


class InstanceState:
    """One SPMD instance: its program id, on-chip memory accounting and engine registers."""

    def __init__(self, launch: LaunchState, program_id=()):
        self.launch = launch
        self.program_id = tuple(program_id)
        # instruction count and on-chip buffers for the capacity check (interpretation only)
        self.liveness = Liveness(launch.target) if launch.account_memory else None
        self.shared_counter = 0
        # accumulation registers of instructions with reduce_cmd (per engine)
        self.accumulators: dict = {}
        self.rng = np.random.default_rng(0)


_local = threading.local()
_default: InstanceState | None = None


def current() -> InstanceState:
    st = getattr(_local, "state", None)
    if st is not None:
        return st
    # Outside a kernel (interactive use, unit tests of single instructions):
    # behave like a one-instance launch that never ends.
    global _default
    if _default is None:
        _default = InstanceState(LaunchState(kernel_name="<interactive>"))
    return _default


def in_kernel() -> bool:
    return getattr(_local, "state", None) is not None


class running:
    """Context manager making ``state`` the current instance."""

    def __init__(self, state: InstanceState):
        self.state = state

    def __enter__(self):
        self.prev = getattr(_local, "state", None)
        _local.state = self.state
        return self.state

    def __exit__(self, *exc):
        _local.state = self.prev
        return False
