"""The NeuronCore as a kernel sees it: memories, capacities, tile limits, and the machine models.

Three machine models, with figures from AWS's architecture guides for NKI
(Trainium/Inferentia2, Trainium2, Trainium3) and its DMA bandwidth guide:

=========  ==============  ==========  ==========  =====================================
model      NeuronCore      SBUF        PSUM        device
=========  ==============  ==========  ==========  =====================================
``trn1``   v2              24 MiB      2 MiB       Trainium1: 2 cores, 32 GiB HBM
``trn2``   v3 (default)    28 MiB      2 MiB       Trainium2: 8 cores, 96 GiB HBM
``trn3``   v4              32 MiB      2 MiB       Trainium3: 8 cores, 144 GiB HBM
=========  ==============  ==========  ==========  =====================================

All have 128 partitions and 8 PSUM banks of 2 KiB per partition.  One
setting selects the model: ``TORCHNEURON_MACHINE`` (``trn2``/``trn3``/
``trn1``, or ``trainium2``, ``v3``, ``gen3``, ``NeuronCore-v3``, ...) or
``set_machine()``; ``@nki.jit(target=...)`` / ``platform_target=`` choose
one for a kernel.  The emulator reads it per launch; the runtime's device
properties (name, cores per device, memory per core) are the ``device_*``
fields below (see docs/nki.md, "Machine models").
"""
from __future__ import annotations

import math
import enum
import os
import sys
import threading
from dataclasses import dataclass, field

import numpy as np

from . import dtypes as _dt

ENV = "TORCHNEURON_MACHINE"
# accepted as well, for the emulator only
NKI_ENV = "TORCHNEURON_NKI_TARGET"


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


@dataclass(frozen=True, eq=False)
class Machine:
    """One NeuronCore generation: what the emulator enforces and what the performance model charges."""

    key: str                         # "trn2"
    name: str                        # "NeuronCore-v3"
    generation: int                  # 3
    device: str                      # "Trainium2"
    sbuf_bytes_per_partition: int
    cores_per_device: int
    hbm_bytes_per_device: int
    hbm_bytes_per_s_per_device: float
    psum_bytes_per_partition: int = 16 * 1024
    psum_banks: int = 8
    partitions: int = 128
    # engines and their clocks (GHz)
    clock_ghz: dict = field(default_factory=dict)
    # Tensor Engine peak TFLOPS by input class ("bf16", "fp32", "fp8", "mx")
    tensor_tflops: dict = field(default_factory=dict)
    # elements per partition per cycle: (base, bf16/fp16 performance mode)
    vector_rate: tuple = (1, 1)
    scalar_rate: tuple = (1, 1)
    gpsimd_rate: tuple = (1, 1)
    # DMA: per-engine bandwidth (bytes/ns), engines per core, fixed latency (ns)
    dma_bytes_per_ns_per_engine: float = 17.0
    dma_engines: int = 16
    dma_latency_ns: float = 1300.0
    # capabilities
    mx_matmul: bool = False          # nc_matmul_mx, quantize_mx, the _x4 dtypes
    bf16_psum: bool = False          # matmul results stored as bfloat16 in PSUM

    @property
    def sbuf_bytes(self) -> int:
        return self.sbuf_bytes_per_partition * self.partitions

    @property
    def engines(self) -> tuple:
        return ("tensor", "vector", "scalar", "gpsimd", "dma")

    @property
    def device_name(self) -> str:
        """The runtime's device name for this model."""
        return f"{self.name} (emulated)"

    @property
    def hbm_bytes_per_core(self) -> int:
        return self.hbm_bytes_per_device // self.cores_per_device

    @property
    def dma_bytes_per_ns(self) -> float:
        """Aggregate DMA bandwidth of one core (bytes per ns = GB/s)."""
        return self.dma_bytes_per_ns_per_engine * self.dma_engines

    def __repr__(self):
        return f"<machine {self.key}: {self.device} {self.name}>"


GiB = 1 << 30
MiB = 1 << 20

MACHINES = {
    "trn1": Machine(
        "trn1", "NeuronCore-v2", 2, "Trainium1", sbuf_bytes_per_partition=24 * MiB // 128,
        cores_per_device=2, hbm_bytes_per_device=32 * GiB, hbm_bytes_per_s_per_device=820e9,
        clock_ghz={"tensor": 2.8, "vector": 1.12, "scalar": 1.4, "gpsimd": 1.4},
        tensor_tflops={"bf16": 92.0, "fp8": 92.0, "fp32": 23.0},
        vector_rate=(1, 1), scalar_rate=(1, 1), gpsimd_rate=(1, 1),
        dma_bytes_per_ns_per_engine=17.0),
    "trn2": Machine(
        "trn2", "NeuronCore-v3", 3, "Trainium2", sbuf_bytes_per_partition=28 * MiB // 128,
        cores_per_device=8, hbm_bytes_per_device=96 * GiB, hbm_bytes_per_s_per_device=3.0e12,
        clock_ghz={"tensor": 2.4, "vector": 0.96, "scalar": 1.2, "gpsimd": 1.2},
        tensor_tflops={"bf16": 79.0, "fp8": 158.0, "fp32": 20.0},
        vector_rate=(2, 4), scalar_rate=(1, 1), gpsimd_rate=(1, 1),
        dma_bytes_per_ns_per_engine=23.0),
    "trn3": Machine(
        "trn3", "NeuronCore-v4", 4, "Trainium3", sbuf_bytes_per_partition=32 * MiB // 128,
        cores_per_device=8, hbm_bytes_per_device=144 * GiB, hbm_bytes_per_s_per_device=4.7e12,
        clock_ghz={"tensor": 2.4, "vector": 1.2, "scalar": 1.2, "gpsimd": 1.2},
        tensor_tflops={"bf16": 79.0, "fp8": 79.0, "fp32": 20.0, "mx": 315.0},
        vector_rate=(2, 4), scalar_rate=(1, 2), gpsimd_rate=(1, 1),
        dma_bytes_per_ns_per_engine=33.0, mx_matmul=True, bf16_psum=True),
}

_ALIASES = {
    "trn1": "trn1", "inf2": "trn1", "trainium1": "trn1", "trainium": "trn1", "gen2": "trn1", "v2": "trn1",
    "neuroncore-v2": "trn1", "nc2": "trn1",
    "trn2": "trn2", "trainium2": "trn2", "gen3": "trn2", "v3": "trn2", "neuroncore-v3": "trn2", "nc3": "trn2",
    "trn3": "trn3", "trainium3": "trn3", "gen4": "trn3", "v4": "trn3", "neuroncore-v4": "trn3", "nc4": "trn3",
}

# ``@nki.jit(target="v3")`` and friends
TARGETS = {"v2": MACHINES["trn1"], "v3": MACHINES["trn2"], "v4": MACHINES["trn3"]}
Target = Machine

DEFAULT = "trn2"
_override: Machine | None = None


def resolve_machine(name) -> Machine:
    """The machine model a name (``trn2``, ``Trainium3``, ``v4``, ``gen3``, ...) or Machine stands for."""
    if isinstance(name, Machine):
        return name
    if hasattr(name, "value") and isinstance(getattr(name, "value"), int):  # nisa.nc_version members
        name = f"gen{name.value}"
    key = _ALIASES.get(str(name).strip().lower().replace(" ", "").replace("_", ""))
    if key is None:
        raise ValueError(f"unknown machine {name!r}: expected one of trn1, trn2, trn3 "
                         f"(or {', '.join(sorted(k for k in _ALIASES if k not in MACHINES))})")
    return MACHINES[key]


def set_machine(name) -> Machine:
    """Select the machine model for kernels launched from now on (all threads), and for the runtime.

    Also sets ``TORCHNEURON_MACHINE`` in this process's environment, which
    the runtime reads when it initialises its devices: call it before the
    first ``neuron`` tensor for the device properties to follow.  ``None``
    returns to the environment's setting.
    """
    global _override
    if name is None:
        _override = None
        os.environ.pop(ENV, None)
        return default_target()
    m = resolve_machine(name)
    _override = m
    os.environ[ENV] = m.key
    return m


def get_machine() -> Machine:
    """The machine model in effect (``set_machine``, else TORCHNEURON_MACHINE, else Trainium2)."""
    return default_target()


def default_target() -> Machine:
    if _override is not None:
        return _override
    for var in (ENV, NKI_ENV):
        value = os.environ.get(var)
        if value:
            try:
                return resolve_machine(value)
            except ValueError as e:
                raise ValueError(f"{var}: {e}") from None
    return MACHINES[DEFAULT]


class TileSize:
    """The per-instruction tile limits (the same on every model)."""

    pmax = 128
    psum_fmax = 512
    psum_bank_fmax = 512
    psum_bank_fmax_bytes = 2048
    psum_num_banks = 8
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    psum_min_align = 4
    sbuf_min_align = 1


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


class _ReusedStorage:
    """Host storage for a launch's new HBM tensor that the kernel writes whole
    before reading it (its initial contents are never seen), reused once the
    caller has let go of every array over it: a fresh array's pages would be
    faulted in on every launch. Up to ``keep`` buffers of each size of at most
    ``largest`` bytes; beyond that, a plain ``np.empty``."""

    keep, largest = 2, 64 << 20

    def __init__(self):
        self._lock = threading.Lock()
        self._bufs = {}  # nbytes -> [bytearray]

    def __call__(self, shape, st) -> np.ndarray:
        n = math.prod(shape) * st.itemsize
        if not 0 < n <= self.largest:
            return np.empty(shape, st)
        with self._lock:
            bufs = self._bufs.setdefault(n, [])
            for b in bufs:
                if sys.getrefcount(b) == 3:  # the list, `b` and the call's argument: no array over it
                    break
            else:
                if len(bufs) == self.keep:
                    return np.empty(shape, st)
                b = bytearray(n)
                bufs.append(b)
            return np.frombuffer(b, np.uint8).view(st).reshape(shape)


reused_storage = _ReusedStorage()


class Allocation:
    """One buffer: its storage array and bookkeeping shared by all views of it.

    On-chip buffers of an interpreted instance carry a ``liveness.Tile``
    (footprint, instruction steps of allocation and last use), from which
    ``liveness.Liveness`` checks the SBUF/PSUM capacity.
    """

    __slots__ = ("data", "buffer", "dtype", "par_axis", "name", "written", "stored", "psum_valid",
                 "readonly", "exact", "tile", "owner", "__weakref__")

    def __init__(self, data: np.ndarray, buffer: Buffer, dtype, par_axis: int = 0, name: str = ""):
        self.data = data
        self.buffer = buffer
        self.dtype = dtype
        self.par_axis = par_axis
        self.name = name
        self.written = False
        # set by a kernel's stores (unlike ``written``, which a host-provided input starts with):
        # tells which inputs a launch writes into (run_on_host_buffers(written=...))
        self.stored = False
        self.readonly = False
        # float32 engine result this buffer was created from, kept until the
        # first write so that assigning it elsewhere rounds only once
        self.exact = None
        # PSUM elements not yet written since allocation: a matmul with
        # accumulate=None overwrites those instead of adding to them.
        self.psum_valid = np.zeros(data.shape, dtype=bool) if buffer is Buffer.psum else None
        # liveness.Tile: footprint and the steps of allocation and last use, when counted
        self.tile = None
        # the buffer whose memory this one reinterprets (.view(dtype), .ap(dtype=)): uses count for it
        self.owner = None


def onchip_footprint(shape, par_axis: int, dtype, buffer: Buffer, machine: Machine | None = None) -> int:
    """Bytes per partition an on-chip tensor occupies.

    SBUF charges every element.  PSUM tensors with block dimensions (axes
    before the partition axis) are the rotating accumulation buffers of
    published kernels; the compiler maps their blocks onto banks modulo the
    available space, so we charge one block.  PSUM elements are 4 bytes wide,
    except 2-byte types on machines that store bfloat16 in PSUM (NeuronCore-v4).
    """
    free = int(math.prod(shape[par_axis + 1:]))
    if buffer is Buffer.psum:
        width = 4
        if machine is not None and machine.bf16_psum and _dt.itemsize(dtype) == 2:
            width = 2
        return free * width
    blocks = int(math.prod(shape[:par_axis]))
    return blocks * free * _dt.itemsize(dtype)
