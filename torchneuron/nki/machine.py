"""The NeuronCore as a kernel sees it: memories, their capacities, tile limits.

Numbers follow the public NKI documentation.  The default target is
NeuronCore-v3 (Trainium2); ``TORCHNEURON_NKI_TARGET=v2`` selects v2.

* SBUF: 128 partitions; 24 MiB per core on v2, 28 MiB on v3 (per partition:
  192 KiB / 224 KiB).
* PSUM: 128 partitions x 16 KiB, as 8 banks of 2 KiB; one matmul result tile
  fits in one bank, hence the 512-float32 free-size limit.
* Tensor Engine: stationary free size <= 128, moving free size <= 512,
  contraction (partition) <= 128.
"""
from __future__ import annotations

import enum
import os
import weakref
from dataclasses import dataclass

import numpy as np

from . import dtypes as _dt
from .errors import NKILimitError


class Buffer(enum.Enum):
    """Where a tensor lives."""

    sbuf = "sbuf"
    psum = "psum"
    hbm = "hbm"                  # kernel arguments
    private_hbm = "private_hbm"  # per-instance device memory
    shared_hbm = "shared_hbm"    # shared by all SPMD instances; kernel outputs

    @property
    def on_chip(self) -> bool:
        return self in (Buffer.sbuf, Buffer.psum)

    def __repr__(self):
        return f"nl.{self.value}"


class TileSize:
    """``nl.tile_size``: the per-instruction tile limits."""

    pmax = 128
    psum_fmax = 512
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    psum_min_align = 4
    sbuf_min_align = 1
    total_available_sbuf_size = None  # filled per target below


@dataclass(frozen=True)
class Target:
    name: str
    sbuf_bytes_per_partition: int
    psum_bytes_per_partition: int = 16 * 1024
    psum_banks: int = 8
    partitions: int = 128


TARGETS = {
    "v2": Target("NeuronCore-v2", sbuf_bytes_per_partition=24 * 1024 * 1024 // 128),
    "v3": Target("NeuronCore-v3", sbuf_bytes_per_partition=28 * 1024 * 1024 // 128),
}


def default_target() -> Target:
    key = os.environ.get("TORCHNEURON_NKI_TARGET", "v3").lower().replace("neuroncore-", "")
    try:
        return TARGETS[key]
    except KeyError:
        raise ValueError(f"TORCHNEURON_NKI_TARGET must be one of {sorted(TARGETS)}, got {key!r}") from None


def debug_enabled() -> bool:
    return os.environ.get("TORCHNEURON_NKI_DEBUG", "0").lower() not in ("", "0", "false", "no", "off")


def new_storage(shape, dtype, debug: bool) -> np.ndarray:
    """Fresh, C-contiguous storage for a new buffer.

    Hardware buffers are uninitialised.  By default we hand out zeros (cheap
    and reproducible); in debug mode floats are NaN and integers a 0xA5 byte
    pattern, so a kernel that reads before writing produces visible garbage.
    """
    st = _dt.storage(dtype)
    if not debug:
        return np.zeros(shape, dtype=st)
    if _dt.is_float(dtype):
        return np.full(shape, np.nan, dtype=st)
    if st == np.bool_:
        return np.ones(shape, dtype=st)
    arr = np.empty(shape, dtype=st)
    arr.view(np.uint8)[...] = 0xA5
    return arr


class MemoryAccount:
    """Per-partition bytes in use in SBUF and PSUM for one kernel instance.

    Allocations are released when the last tensor object referring to them is
    garbage collected, which is how long a value is live in the kernel's
    Python code, and so how long the compiler would have to keep it.
    """

    def __init__(self, target: Target):
        self.target = target
        self.used = {Buffer.sbuf: 0, Buffer.psum: 0}
        self.peak = {Buffer.sbuf: 0, Buffer.psum: 0}

    def capacity(self, buffer: Buffer) -> int:
        return (self.target.sbuf_bytes_per_partition if buffer is Buffer.sbuf
                else self.target.psum_bytes_per_partition)

    def reserve(self, buffer: Buffer, nbytes: int, what: str):
        new = self.used[buffer] + nbytes
        cap = self.capacity(buffer)
        if new > cap:
            raise NKILimitError(
                f"{buffer.value.upper()} capacity ({self.target.name})", f"{new} bytes per partition",
                f"{cap} bytes per partition",
                f"live {buffer.value.upper()} usage after allocating {what}")
        self.used[buffer] = new
        self.peak[buffer] = max(self.peak[buffer], new)

    def release(self, buffer: Buffer, nbytes: int):
        self.used[buffer] -= nbytes


class Allocation:
    """One buffer: its storage array and bookkeeping shared by all views of it."""

    __slots__ = ("data", "buffer", "dtype", "par_axis", "name", "written", "psum_valid",
                 "readonly", "exact", "__weakref__")

    def __init__(self, data: np.ndarray, buffer: Buffer, dtype, par_axis: int = 0, name: str = "",
                 account: MemoryAccount | None = None, footprint: int = 0):
        self.data = data
        self.buffer = buffer
        self.dtype = dtype
        self.par_axis = par_axis
        self.name = name
        self.written = False
        self.readonly = False
        # float32 engine result this buffer was created from, kept until the
        # first write so that assigning it elsewhere rounds only once
        self.exact = None
        # PSUM elements not yet written since allocation: a matmul with
        # accumulate=None overwrites those instead of adding to them.
        self.psum_valid = np.zeros(data.shape, dtype=bool) if buffer is Buffer.psum else None
        if account is not None and footprint:
            account.reserve(buffer, footprint, f"{name or 'a tensor'} {tuple(data.shape)} {_dt.name(dtype)}")
            weakref.finalize(self, account.release, buffer, footprint)


def onchip_footprint(shape, par_axis: int, dtype, buffer: Buffer) -> int:
    """Bytes per partition an on-chip tensor occupies.

    SBUF charges every element.  PSUM tensors with block dimensions (axes
    before the partition axis) are the rotating accumulation buffers of
    published kernels; the compiler maps their blocks onto banks modulo the
    available space, so we charge one block.  PSUM elements are 4 bytes wide.
    """
    free = int(np.prod(shape[par_axis + 1:], dtype=np.int64))
    if buffer is Buffer.psum:
        return free * 4
    blocks = int(np.prod(shape[:par_axis], dtype=np.int64))
    return blocks * free * _dt.itemsize(dtype)
