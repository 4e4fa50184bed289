"""The performance model: modelled latency of a kernel on the chosen machine, engine by engine.

While a kernel is interpreted with a ``Recorder`` attached, every outermost
instruction becomes a record: its name, kernel line, and the tensors it reads
and writes (memory, dtype, shape, bytes, the region of its buffer, the
contiguous run the DMA would move).  ``schedule(records, machine)`` charges
each instruction to an engine (Tensor, Vector, Scalar, GpSimd, or the DMA
queues) with a cost from the published figures of the machine
(``machine.MACHINES``), and runs the engines concurrently: every engine
executes its own instructions in program order, and an instruction starts
when its engine is free and the instructions it depends on (overlapping
reads and writes of the same buffer region) have finished.

Costs (cycles of the engine's clock unless stated):

* Tensor Engine matmul: ``max(N, 64)`` for a moving free size ``N``
  (bf16/fp16/tf32/fp8 inputs; 4x for fp32), at least a quarter of the
  stationary free size (fast LoadStationary, otherwise in the background);
  the MX matmul (NeuronCore-v4) moves 4x the contraction in the same time.
  A Tensor Engine transpose is a matmul against the identity (fp32 2x).
* Vector/Scalar/GpSimd: ``N * inputs / rate`` for ``N`` elements per
  partition, at least 64 cycles; ``rate`` is 1 element per partition per
  cycle, or the bf16/fp16 performance modes of NeuronCore-v3/v4 (4x for
  tensor_copy/tensor_scalar in SBUF, 2x with PSUM or tensor_tensor; ScalarE
  2x on v4); an innermost stride over 16 bytes halves it.  Results are
  visible to dependent instructions 100 cycles after the engine finishes
  (64 for the Tensor Engine).
* DMA: the bytes plus 512 bytes of overhead per contiguous chunk, at the
  aggregate bandwidth of the core's 16 DMA engines (fewer for tiles of fewer
  rows), and a fixed 1.3 us until the consumer may start.  Transposing DMAs
  run at 90% (from HBM) or 50% (SBUF to SBUF) of that on v3/v4.
* Nothing, for what the compiler does not emit: allocations, access
  patterns, a zeroed PSUM accumulator (its first matmul overwrites), a
  result assigned into a tile or accumulated into PSUM and used nowhere
  else (its producer writes there), ``t[...] += x`` assigning its view back.

The model's latency is the time the last instruction finishes.  MFU is the
matmul work at the peak rate of its input type over that latency; MBU the
bytes moved to or from HBM over the latency at the DMA bandwidth.  This is a
model from public figures, not a cycle-accurate simulator; what it gets
right is the relative cost of kernels (memory- against compute-bound,
engine balance, overlap).
"""
from __future__ import annotations

import bisect
import json
import math
import time
import weakref

import numpy as np

from . import dtypes as _dt
from .jit import Kernel, jit, run_on_host_buffers
from .liveness import kernel_site
from .machine import Buffer, Machine, default_target, resolve_machine
from .ops import UNARY
from .tensor import NkiTensor
from .typing import TensorSpec

# ----------------------------------------------------------------- records


class Access:
    """One tensor an instruction touches."""

    __slots__ = ("root", "buffer", "dtype", "itemsize", "n", "partitions", "box", "run", "write",
                 "inner_stride", "role")

    def __init__(self, root, buffer, dtype, itemsize, n, partitions, box, run, write, inner_stride, role=None):
        self.root, self.buffer, self.dtype, self.itemsize = root, buffer, dtype, itemsize
        self.n, self.partitions, self.box, self.run = n, partitions, box, run
        self.write, self.inner_stride, self.role = write, inner_stride, role

    @property
    def nbytes(self):
        return self.n * self.itemsize

    @property
    def free(self):
        return self.n // max(1, self.partitions)


class Record:
    """One executed instruction: what the model needs to cost and order it."""

    __slots__ = ("name", "kind", "accesses", "options", "site", "instance", "step")

    def __init__(self, name, kind, accesses, options, site, instance, step):
        self.name, self.kind, self.accesses, self.options = name, kind, accesses, options
        self.site, self.instance, self.step = site, instance, step


_UNARY_NAMES = None


def _unary_name(f):
    global _UNARY_NAMES
    if _UNARY_NAMES is None:
        _UNARY_NAMES = {id(v): k for k, v in UNARY.items()}
    return _UNARY_NAMES.get(id(f), getattr(f, "__name__", "op"))


# where a written argument is, per instruction, when it is not the result
_WRITES_FIRST_ARG = {"store", "assign", "update", "dma_copy", "dma_transpose"}
_WRITTEN_KWARGS = ("dst", "reduce_res", "dst_scale", "out")


class Recorder:
    """Collects records of the instructions of one launch (attached to each instance's liveness count)."""

    def __init__(self):
        self.records: list[Record] = []
        self._ids = weakref.WeakKeyDictionary()
        self._next_id = 0
        self._geometry: dict = {}
        self.instance = ()
        # (program id, liveness.Liveness) of each instance: the tiles' allocation and last-use steps
        self.lives = []

    def _root_id(self, alloc):
        rid = self._ids.get(alloc)
        if rid is None:
            self._next_id += 1
            rid = self._ids[alloc] = self._next_id
        return rid

    def record(self, fn, args, kwargs, out, step):
        name = fn.__name__
        module = fn.__module__.rsplit(".", 1)[-1]
        written = set()
        tiles = []
        roles = {}

        def collect(v, kw=None):
            if isinstance(v, NkiTensor):
                tiles.append(v)
                if kw is not None:
                    roles.setdefault(id(v), kw)
                if kw in _WRITTEN_KWARGS:
                    written.add(id(v))
            elif isinstance(v, (list, tuple)):
                for x in v:
                    collect(x)
            elif isinstance(v, dict):
                for x in v.values():
                    collect(x)

        for a in args:
            collect(a)
        for k, v in (kwargs or {}).items():
            collect(v, k)
        if name in _WRITES_FIRST_ARG and args and isinstance(args[0], NkiTensor):
            written.add(id(args[0]))
        outs = []
        if isinstance(out, NkiTensor):
            outs = [out]
        elif isinstance(out, (list, tuple)):
            outs = [o for o in out if isinstance(o, NkiTensor)]
        arg_ids = {id(t) for t in tiles}
        for o in outs:
            written.add(id(o))
            if id(o) not in arg_ids:
                tiles.append(o)
        seen = set()
        accesses = []
        for t in tiles:
            if id(t) in seen:
                continue
            seen.add(id(t))
            accesses.append(self._access(t, id(t) in written, roles.get(id(t))))
        options = {}
        for k in ("engine", "perf_mode", "is_transpose", "transpose_x", "reduce_res", "accumulate"):
            if kwargs and k in kwargs:
                options[k] = kwargs[k] if k != "reduce_res" else True
        kind = name
        if module == "ops" and name == "unary":
            kind = "unary:" + _unary_name(args[0]) if args else name
            name = _unary_name(args[0]) if args else name
        elif module == "ops" and name == "binary":
            f = args[0] if args else None
            name = (kwargs or {}).get("what") or getattr(f, "__name__", "binary")
        elif module == "language" and getattr(fn, "_unary", None) is not None:
            kind = "unary:" + name
        prefix = {"language": "nl.", "isa": "nisa.", "ops": "", "tensor": ""}.get(module, "")
        if module == "language" and name.startswith("_loop_reduce"):
            name = "loop_reduce"
        if module == "tensor" and name == "assign":
            name = "tile assignment"
        if module == "ops" and name == "update":
            name = "in-place update"
        label = name if name.startswith("nl.") or not prefix else prefix + name
        self.records.append(Record(label, (module, kind), accesses, options, kernel_site(),
                                   self.instance, step))

    def _access(self, t, write, role=None):
        alloc = t._alloc
        root = alloc.owner if alloc.owner is not None else alloc
        dtype = t.dtype
        isz = _dt.itemsize(dtype)
        shape = tuple(t.shape)
        n = int(math.prod(shape)) if shape else 1
        box, run, inner = self._geometry_of(t, root, isz)
        # the partitions (rows, in HBM) the view spans: for a tile with block axes before its
        # partition axis (nl.par_dim) that is not its first dimension
        parts = max(1, min(box[1] - box[0], n))
        return Access(self._root_id(root), root.buffer, dtype, isz, n, parts, box, run, write, inner, role)

    def _geometry_of(self, t, root, isz):
        """(box, contiguous run in bytes, innermost stride in bytes) of view ``t`` in ``root``'s storage."""
        rdata = root.data
        rshape = tuple(rdata.shape)
        par = root.par_axis if root.buffer.on_chip else 0
        risz = rdata.itemsize
        P = int(rshape[par]) if rshape else 1
        inner = int(math.prod(rshape[par + 1:])) * risz if rshape else risz
        if t._arr is not None:
            off_b = t._arr.__array_interface__["data"][0] - rdata.__array_interface__["data"][0]
            strides = tuple(int(s) for s in t._arr.strides)
            key = (rshape, par, risz, tuple(t._arr.shape), off_b, strides, isz)
            g = self._geometry.get(key)
            if g is None:
                g = self._geometry[key] = _strided_geometry(tuple(t._arr.shape), off_b, strides, isz, P, inner)
            return g
        keys = t._key
        scale = t._alloc.data.itemsize
        return _gathered_geometry(keys, scale, P, inner, isz)


def _strided_geometry(shape, off_b, strides, isz, P, inner):
    """Region of a strided view: partitions [p0, p1), bytes [f0, f1) within a partition."""
    span = inner * P
    blk, rem = divmod(off_b, span)
    p0, f0 = divmod(rem, inner)
    f0 += blk * inner
    plo = phi = p0
    flo = fhi = f0
    for n, s in zip(shape, strides):
        if n <= 1:
            continue
        ext = (n - 1) * s
        if s % span == 0 and span:
            d = (ext // span) * inner
            flo, fhi = flo + min(0, d), fhi + max(0, d)
        elif s % inner == 0:
            d = ext // inner
            plo, phi = plo + min(0, d), phi + max(0, d)
        else:
            flo, fhi = flo + min(0, ext), fhi + max(0, ext)
    box = (max(0, plo), min(P, phi + 1), max(0, flo), fhi + isz)
    run = isz
    expected = isz
    inner_stride = isz
    for n, s in reversed(list(zip(shape, strides))):
        if n == 1:
            continue
        inner_stride = abs(s) if inner_stride == isz and s != isz else inner_stride
        if s == expected:
            run = expected * n
            expected = run
        else:
            break
    return box, min(run, inner), inner_stride


def _gathered_geometry(keys, scale, P, inner, isz):
    """Region of an index-grid view: partitions from the extreme elements, the bytes within a
    partition from the first and last rows of the grid (index grids are affine, so every row
    covers the same span), the contiguous run from the first row."""
    k = np.asarray(keys)
    if k.size == 0:
        return (0, 0, 0, 0), isz, isz
    span = inner * P
    lo, hi = int(k.min()) * scale, int(k.max()) * scale
    if lo // span == hi // span:
        p0, p1 = (lo % span) // inner, (hi % span) // inner + 1
    else:
        p0, p1 = 0, P
    rows = k.reshape(-1, k.shape[-1]) if k.ndim else k.reshape(1, 1)
    edge = np.concatenate([rows[0], rows[-1]]).astype(np.int64) * scale
    free = (edge // span) * inner + edge % inner
    box = (p0, p1, int(free.min()), int(free.max()) + isz)
    run = isz
    inner_stride = isz
    if rows.shape[1] > 1:
        d = np.diff(rows[0]).astype(np.int64) * scale
        if (d == isz).all():
            run = isz * rows.shape[1]
        else:
            inner_stride = int(np.abs(d).max())
    return box, min(run, inner), inner_stride


# ------------------------------------------------------------------- costs

_DMA = {"load", "store", "dma_copy", "load_transpose2d", "dma_transpose", "dma_compute", "sendrecv"}
_TRANSPOSING_DMA = {"load_transpose2d", "dma_transpose"}
_FREE = {"ndarray", "ap", "view", "shared_constant", "device_print", "random_seed", "core_barrier"}
_TENSOR = {"nc_matmul", "matmul", "nc_matmul_mx", "nc_transpose", "transpose"}
_SCALAR = {"activation", "activation_reduce", "softmax"}
_ACTIVATION_FUNCS = {"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "gelu_apprx_tanh",
                     "gelu_apprx_sigmoid", "gelu_dx", "silu", "silu_dx", "softplus", "mish", "erf", "erf_dx",
                     "sin", "cos", "tan", "arctan", "square", "reciprocal"}
_GPSIMD = {"iota", "affine_select", "tensor_partition_reduce", "rand", "nonzero_with_count", "nc_n_gather"}
_PERF_MODE_OPS = {"tensor_copy", "tensor_scalar", "copy", "unary:copy", "assign", "broadcast_to", "memset",
                  "zeros", "ones", "full"}
_TWO_INPUT = {"tensor_tensor", "scalar_tensor_tensor", "tensor_tensor_scan", "binary", "update", "where",
              "tensor_copy_predicated"}

TENSOR_MIN_CYCLES = 64
TENSOR_LATENCY_CYCLES = 64
ENGINE_MIN_CYCLES = 64
ENGINE_LATENCY_CYCLES = 100
DMA_CHUNK_OVERHEAD_BYTES = 512


class Cost:
    """An instruction's engine, time on it (ns), delay until consumers may start, share of the engine
    it holds (the DMA bandwidth), matmul FLOPs and their time at the peak rate, bytes to or from HBM."""

    __slots__ = ("engine", "busy", "latency", "occupancy", "flops", "ideal", "hbm_bytes")

    def __init__(self, engine, busy=0.0, latency=0.0, occupancy=None, flops=0.0, ideal=0.0, hbm_bytes=0):
        self.engine, self.busy, self.latency = engine, busy, latency
        self.occupancy = busy if occupancy is None else occupancy
        self.flops, self.ideal, self.hbm_bytes = flops, ideal, hbm_bytes


def _engine_name(value):
    if value is None:
        return None
    v = getattr(value, "value", value)
    v = str(v).lower()
    for e in ("tensor", "vector", "scalar", "gpsimd"):
        if e in v:
            return e
    return None


def _matmul_class(dtypes):
    """The Tensor Engine rate a matmul runs at: fp32 inputs at a quarter of the bf16 rate."""
    return "fp32" if any(_dt.name(d) == "float32" for d in dtypes) else "bf16"


def cost_of(rec: Record, machine: Machine) -> Cost:
    _, kind = rec.kind
    base = kind.split(":")[0]
    reads = [a for a in rec.accesses if not a.write]
    writes = [a for a in rec.accesses if a.write]
    if base in _FREE:
        return Cost("none")
    if base in ("zeros", "ones", "full") and writes and not writes[0].buffer.on_chip:
        return Cost("none")
    if base == "zeros" and writes and writes[0].buffer is Buffer.psum:
        # a zeroed PSUM accumulator: the first matmul of its accumulation group overwrites instead
        return Cost("none")
    if base in _DMA:
        return _dma_cost(rec, machine, reads, writes, base)
    if base == "assign" and reads and reads[0].buffer.on_chip and writes and writes[0].buffer.on_chip:
        # a copy, unless the producing instruction writes there directly (decided in schedule)
        return _vector_cost(rec, machine, reads, writes, base, "vector")
    if base in _TENSOR:
        if base in ("nc_transpose",) and _engine_name(rec.options.get("engine")) == "vector":
            return _vector_cost(rec, machine, reads, writes, base, "vector")
        return _tensor_cost(rec, machine, reads, writes, base)
    eng = _engine_name(rec.options.get("engine"))
    if eng is None:
        if base in _SCALAR or (base == "unary" and kind.split(":")[1] in _ACTIVATION_FUNCS):
            eng = "scalar"
        elif base in _GPSIMD:
            eng = "gpsimd"
        else:
            eng = "vector"
    if eng == "tensor":
        eng = "vector"
    return _vector_cost(rec, machine, reads, writes, kind, eng)


def _tensor_cost(rec, machine, reads, writes, base):
    clock = machine.clock_ghz["tensor"]
    sbuf_reads = [a for a in reads if a.buffer.on_chip]
    if base in ("nc_transpose", "transpose"):
        src = sbuf_reads[0] if sbuf_reads else None
        parts = src.partitions if src else 128
        f = 2 if src is not None and _dt.name(src.dtype) == "float32" else 1
        cycles = max(parts, TENSOR_MIN_CYCLES) * f
        return Cost("tensor", cycles / clock, TENSOR_LATENCY_CYCLES / clock)
    if len(sbuf_reads) < 2:
        return Cost("tensor", TENSOR_MIN_CYCLES / clock, TENSOR_LATENCY_CYCLES / clock)
    # by keyword, else stationary first and moving second (both calling conventions)
    by_role = {a.role: a for a in sbuf_reads if a.role}
    positional = [a for a in sbuf_reads if not a.role]
    stationary = by_role.get("stationary") or by_role.get("x") or (positional.pop(0) if positional else None)
    moving = by_role.get("moving") or by_role.get("y") or (positional.pop(0) if positional else None)
    if stationary is None or moving is None:
        return Cost("tensor", TENSOR_MIN_CYCLES / clock, TENSOR_LATENCY_CYCLES / clock)
    k, m, n = stationary.partitions, stationary.free, moving.free
    if base == "matmul" and not rec.options.get("transpose_x", False):
        k, m = stationary.free, stationary.partitions  # x is [M, K]: transposed on the way
    if base == "nc_matmul_mx":
        cycles = max(n, TENSOR_MIN_CYCLES, m / 4)
        flops = 2.0 * k * 4 * m * n
        ideal = flops / (machine.tensor_tflops.get("mx", machine.tensor_tflops["bf16"]) * 1e3)
        return Cost("tensor", cycles / clock, TENSOR_LATENCY_CYCLES / clock, flops=flops, ideal=ideal)
    cls = _matmul_class((stationary.dtype, moving.dtype))
    f = 4 if cls == "fp32" else 1
    cycles = max(max(n, TENSOR_MIN_CYCLES) * f, m * f / 4)
    if base == "matmul" and not rec.options.get("transpose_x", False):
        cycles += max(k, TENSOR_MIN_CYCLES) * (2 if cls == "fp32" else 1)  # the transpose nl.matmul adds
    flops = 2.0 * k * m * n
    ideal = flops / (machine.tensor_tflops[cls] * 1e3)
    return Cost("tensor", cycles / clock, TENSOR_LATENCY_CYCLES / clock, flops=flops, ideal=ideal)


def _is16(a):
    return _dt.itemsize(a.dtype) == 2 and _dt.is_float(a.dtype)


def _vector_cost(rec, machine, reads, writes, kind, eng):
    base = kind.split(":")[0]
    clock = machine.clock_ghz[eng]
    tiles = [a for a in rec.accesses if a.buffer.on_chip]
    if not tiles:
        return Cost(eng, ENGINE_MIN_CYCLES / clock, ENGINE_LATENCY_CYCLES / clock)
    in_tiles = [a for a in reads if a.buffer.on_chip] or tiles
    n = max(a.free for a in tiles)
    inputs = max(1, min(len(in_tiles), 2)) if base in _TWO_INPUT else 1
    if base == "update":
        inputs = 2  # the target is read too
    rate_base, rate_perf = {"vector": machine.vector_rate, "scalar": machine.scalar_rate,
                            "gpsimd": machine.gpsimd_rate}[eng]
    rate = rate_base
    if rate_perf > rate_base and all(_is16(a) for a in tiles):
        if base in _PERF_MODE_OPS or kind == "unary:copy":
            contiguous = all(a.inner_stride == a.itemsize for a in tiles)
            in_sbuf = all(a.buffer is Buffer.sbuf for a in tiles)
            rate = rate_perf if (contiguous and in_sbuf) else min(rate_perf, 2 * rate_base)
        elif base in ("tensor_tensor", "binary") and eng == "vector" and all(a.buffer is Buffer.sbuf for a in in_tiles):
            rate = min(rate_perf, 2 * rate_base)
    if base in ("quantize_mx", "exponential"):
        rate = 4
    if any(a.inner_stride > 16 for a in tiles):
        rate = rate / 2
    cycles = n * inputs / rate
    if base == "tensor_partition_reduce":
        cycles *= 8
    if rec.options.get("reduce_res") or base == "activation_reduce":
        cycles += ENGINE_MIN_CYCLES  # reading the accumulation register back
    if base == "softmax":
        cycles *= 4
    busy = max(cycles, ENGINE_MIN_CYCLES) / clock
    return Cost(eng, busy, ENGINE_LATENCY_CYCLES / clock)


def _dma_cost(rec, machine, reads, writes, base):
    dst = writes[0] if writes else (rec.accesses[-1] if rec.accesses else None)
    src = reads[0] if reads else dst
    if dst is None:
        return Cost("none")
    nbytes = max(dst.nbytes, src.nbytes if src is not None else 0)
    if base == "dma_compute":  # every source is read through the DMA engines
        nbytes = max(dst.nbytes, sum(a.nbytes for a in reads))
    run = min(dst.run, src.run if src is not None else dst.run)
    transposing = base in _TRANSPOSING_DMA
    eff = 1.0
    if transposing:
        if machine.generation <= 2:
            run = min(dst.itemsize, run)
        else:
            run = dst.itemsize * 16
            eff = 0.5 if (src is not None and src.buffer.on_chip) else 0.9
    run = max(1, run)
    chunks = max(1, nbytes // run)
    moved = (nbytes + chunks * DMA_CHUNK_OVERHEAD_BYTES) / eff
    occupancy = moved / machine.dma_bytes_per_ns
    rows = max(dst.partitions, src.partitions if src is not None else 1)
    engines = max(1, min(machine.dma_engines, rows, chunks))
    duration = max(occupancy, moved / (machine.dma_bytes_per_ns_per_engine * engines))
    hbm = nbytes if (not dst.buffer.on_chip or (src is not None and not src.buffer.on_chip)) else 0
    return Cost("dma", duration, machine.dma_latency_ns, occupancy=occupancy, hbm_bytes=hbm)


# -------------------------------------------------------------- scheduling

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")


class _Entry:
    __slots__ = ("box", "end", "done", "engine")

    def __init__(self, box, end, done, engine):
        self.box, self.end, self.done, self.engine = box, end, done, engine


def _overlaps(a, b):
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


def _inside(a, b):
    """Box a lies within box b."""
    return b[0] <= a[0] and a[1] <= b[1] and b[2] <= a[2] and a[3] <= b[3]


class _Bandwidth:
    """The DMA queues' shared bandwidth.  A transfer uses the bandwidth left free by the transfers
    issued before it, from when it may start until its bytes have moved, in as many pieces as the
    free time comes in: DMAs are spread over 16 queues, so a transfer waiting for its data does not
    hold back later, independent ones (the compute engines, unlike this, run in program order)."""

    def __init__(self):
        self.starts = []   # sorted, disjoint busy intervals [starts[i], ends[i])
        self.ends = []

    def place(self, t, length):
        """Occupy ``length`` ns of free bandwidth from ``t`` on; returns (first start, last end)."""
        starts, ends = self.starts, self.ends
        i = bisect.bisect_right(ends, t)
        if i < len(starts) and starts[i] <= t:
            t = ends[i]
            i += 1
        first = None
        left = length
        cur = t
        pieces = []
        while left > 0:
            gap_end = starts[i] if i < len(starts) else float("inf")
            take = min(left, gap_end - cur)
            if take > 0:
                if first is None:
                    first = cur
                pieces.append((cur, cur + take))
                left -= take
                cur += take
            if left > 0:
                cur = ends[i]
                i += 1
        if first is None:
            first = cur
        for a, b in pieces:
            self._occupy(a, b)
        return first, cur

    def _occupy(self, a, b):
        starts, ends = self.starts, self.ends
        i = bisect.bisect_left(starts, a)
        starts.insert(i, a)
        ends.insert(i, b)
        if i > 0 and ends[i - 1] >= a:          # merge with the previous interval
            ends[i - 1] = max(ends[i - 1], b)
            del starts[i], ends[i]
            i -= 1
        while i + 1 < len(starts) and starts[i + 1] <= ends[i]:
            ends[i] = max(ends[i], ends[i + 1])
            del starts[i + 1], ends[i + 1]


class Report:
    """The modelled execution of one kernel launch on one NeuronCore."""

    def __init__(self, machine, latency_ns, busy, counts, flops, ideal_ns, hbm_bytes, events, kernel_name=""):
        self.machine = machine
        self.kernel_name = kernel_name
        self.latency_ns = latency_ns
        self.flops = flops
        self.hbm_bytes = hbm_bytes
        self.instructions = sum(counts.values())
        self.engines = {e: {"busy_ns": busy[e], "busy": (busy[e] / latency_ns if latency_ns else 0.0),
                            "instructions": counts[e]} for e in ENGINES}
        self.mfu = ideal_ns / latency_ns if latency_ns else 0.0
        self.mbu = (hbm_bytes / machine.dma_bytes_per_ns) / latency_ns if latency_ns else 0.0
        self._events = events
        self.occupancy = [(0.0, 0, 0)]
        self.kernel_file = None

    @property
    def latency_us(self):
        return self.latency_ns / 1e3

    @property
    def bottleneck(self):
        return max(ENGINES, key=lambda e: self.engines[e]["busy_ns"])

    def timeline(self):
        """The instructions on their engines: a list of dicts with ``engine``, ``start`` and ``end``
        (ns from the kernel's start), ``name``, ``source`` (file:line), and ``ready`` (when a
        consumer may start), ``instance`` (SPMD program id), ``function``, ``step``."""
        return [dict(e) for e in self._events]

    def summary(self) -> str:
        lines = [f"modelled on {self.machine.device} ({self.machine.name}): {self.latency_us:.2f} us, "
                 f"MFU {100 * self.mfu:.1f}%, MBU {100 * self.mbu:.1f}%, {self.instructions} instructions"]
        for e in ENGINES:
            s = self.engines[e]
            if s["instructions"]:
                lines.append(f"  {e:<7} {100 * s['busy']:5.1f}% busy, {s['instructions']} instructions")
        return "\n".join(lines)

    def nki_trace(self, source=None):
        """This kernel in the explorer's ``neuronNkiKernels`` layout (docs/explorer.md): instructions per
        engine with their kernel lines, SBUF/PSUM occupancy over time, the capacities, and ``source``
        (by default the text of the kernel's file, whose line numbers the instructions name)."""
        names = {"tensor": "Tensor", "vector": "Vector", "scalar": "Scalar", "gpsimd": "GpSimd", "dma": "DMA"}
        if source is None:
            source = self.source_text()
        return {
            "kernel": self.kernel_name, "source": source,
            "instructions": [{"engine": names[e["engine"]], "name": e["name"], "start_ns": e["start"],
                              "end_ns": e["end"], "line": e["source"]} for e in self._events],
            "occupancy": [{"t_ns": t, "sbuf_bytes": sb, "psum_bytes": ps} for t, sb, ps in self.occupancy],
            "sbuf_capacity": self.machine.sbuf_bytes,
            "psum_capacity": self.machine.psum_bytes_per_partition * self.machine.partitions,
            "machine": self.machine.key, "latency_ns": self.latency_ns, "mfu": self.mfu, "mbu": self.mbu,
        }

    def source_text(self):
        files = [e["source"].rsplit(":", 1)[0] for e in self._events]
        if self.kernel_file:
            files.insert(0, self.kernel_file)
        for f in files:
            try:
                with open(f) as fh:
                    return fh.read()
            except OSError:
                continue
        return ""

    def to_dict(self):
        return {"kernel": self.kernel_name, "machine": self.machine.key, "device": self.machine.device,
                "neuron_core": self.machine.name, "latency_ns": self.latency_ns, "mfu": self.mfu,
                "mbu": self.mbu, "flops": self.flops, "hbm_bytes": self.hbm_bytes,
                "instructions": self.instructions, "engines": self.engines}

    def __repr__(self):
        return f"<nki performance model: {self.summary()}>"


def schedule(records, machine: Machine, kernel_name="", lives=None) -> Report:
    """Run the records on the machine's engines (see the module docstring)."""
    free = dict.fromkeys(ENGINES, 0.0)
    dma = _Bandwidth()
    busy = dict.fromkeys(ENGINES, 0.0)
    counts = dict.fromkeys(ENGINES, 0)
    state: dict = {}   # root -> ([write entries], [read entries])
    flops = ideal = 0.0
    hbm = 0
    end_time = 0.0
    events = []
    last_use = {}
    for i, rec in enumerate(records):
        for a in rec.accesses:
            last_use[a.root] = i
    times = {}   # (instance, step) -> (start, done)
    for i, rec in enumerate(records):
        c = cost_of(rec, machine)
        eng = c.engine
        if eng != "none" and rec.kind[1] in ("assign", "update"):
            # an instruction result assigned into a tile (``t[...] = nl.exp(x)``) or accumulated into
            # PSUM (``psum += nc_matmul(...)``) and used nowhere else is written there by the
            # instruction that produced it: no copy, no vector add
            src = [a for a in rec.accesses if not a.write]
            dst = [a for a in rec.accesses if a.write]
            fused = (src and src[0].buffer.on_chip and last_use.get(src[0].root) == i
                     and (rec.kind[1] == "assign" or (dst and dst[0].buffer is Buffer.psum
                                                       and src[0].buffer is Buffer.psum)))
            # ``t[...] += x`` assigns the updated region back onto itself: nothing moves
            fused = fused or (rec.kind[1] == "assign" and src and dst and src[0].root == dst[0].root
                              and src[0].box == dst[0].box)
            if fused:
                eng = "none"
        ready = 0.0
        for a in rec.accesses:
            st = state.get(a.root)
            if st is None:
                continue
            writes, reads = st
            box = a.box
            for wbox, e in writes.items():
                if _overlaps(box, wbox):
                    t = e.done if (not a.write or e.engine != eng) else e.end
                    if t > ready:
                        ready = t
            if a.write:
                for rbox, by_engine in reads.items():
                    if _overlaps(box, rbox):
                        for e in by_engine.values():
                            t = e.end if e.engine == eng else e.done
                            if t > ready:
                                ready = t
        if eng == "none":
            start = ready
            end = done = start
        else:
            if eng == "dma":
                start, end = dma.place(ready, c.occupancy)
                end = max(end, start + c.busy)
            else:
                start = max(ready, free[eng])
                free[eng] = start + c.occupancy
                end = start + c.busy
            done = end + c.latency
            busy[eng] += c.occupancy
            counts[eng] += 1
            flops += c.flops
            ideal += c.ideal
            hbm += c.hbm_bytes
            events.append({"engine": eng, "start": start, "end": end, "ready": done, "name": rec.name,
                           "source": f"{rec.site[0]}:{rec.site[1]}", "function": rec.site[2],
                           "instance": rec.instance, "step": rec.step})
        times[(rec.instance, rec.step)] = (start, done)
        if done > end_time:
            end_time = done
        for a in rec.accesses:
            st = state.get(a.root)
            if st is None:
                st = state[a.root] = ({}, {})
            writes, reads = st
            entry = _Entry(a.box, end, done, eng)
            box = a.box
            if a.write:
                # later accesses of what this write covers depend on it, which orders them after
                # the covered writes and reads too: those entries can go
                for b in [b for b in writes if _inside(b, box)]:
                    del writes[b]
                for b in [b for b in reads if _inside(b, box)]:
                    del reads[b]
                writes[box] = entry
            else:
                by_engine = reads.get(box)
                if by_engine is None:
                    reads[box] = {eng: entry}
                else:
                    prev = by_engine.get(eng)
                    if prev is None or prev.done <= done:
                        by_engine[eng] = entry
    events.sort(key=lambda e: (e["start"], ENGINES.index(e["engine"])))
    report = Report(machine, end_time, busy, counts, flops, ideal, hbm, events, kernel_name)
    report.occupancy = _occupancy(lives or (), times, machine)
    return report


def _occupancy(lives, times, machine):
    """[(t_ns, sbuf_bytes, psum_bytes)]: the on-chip bytes live over the modelled time (all partitions)."""
    changes = []
    for pid, live in lives:
        for tile in live.allocs:
            born = times.get((pid, tile.born))
            dead = times.get((pid, tile.last_use))
            if born is None or dead is None:
                continue
            nbytes = tile.footprint * machine.partitions
            sbuf = tile.buffer is Buffer.sbuf
            changes.append((born[0], nbytes if sbuf else 0, 0 if sbuf else nbytes))
            changes.append((max(dead[1], born[0]), -nbytes if sbuf else 0, 0 if sbuf else -nbytes))
    changes.sort(key=lambda c: (c[0], c[1] + c[2] > 0))  # at equal times, frees first
    out = [(0.0, 0, 0)]
    sb = ps = 0
    for t, ds, dp in changes:
        sb += ds
        ps += dp
        if out[-1][0] == t:
            out[-1] = (t, sb, ps)
        else:
            out.append((t, sb, ps))
    return out


# ------------------------------------------------------------ running

def run_profiled(kernel, args, kwargs, *, target=None, hbm_allocator=None):
    """Interpret one launch of ``kernel`` (an ``nki.jit`` Kernel) recording its instructions.

    Returns (result, records, machine, seconds).  The trace cache is not used, so the
    kernel's Python runs and every instruction is seen."""
    if not isinstance(kernel, Kernel):
        kernel = jit(kernel)
    rec = Recorder()
    machine = target or kernel.target
    t0 = time.perf_counter()
    result = run_on_host_buffers(kernel.fn, kernel.grid, args, kwargs, target=machine, debug=kernel.debug,
                                 kernel_name=kernel.fn.__name__, cache=None, profile=rec,
                                 hbm_allocator=hbm_allocator)
    seconds = time.perf_counter() - t0
    records = Records(rec.records)
    records.lives = rec.lives
    records.kernel_file = getattr(getattr(kernel.fn, "__code__", None), "co_filename", None)
    return result, records, machine or default_target(), seconds


class Records(list):
    """A launch's instruction records, with its instances' liveness counts and the kernel's file."""

    lives = ()
    kernel_file = None


def model(records, machine, kernel_name="") -> Report:
    """``schedule`` with the occupancy and source file a ``run_profiled`` recording carries."""
    report = schedule(records, machine, kernel_name, getattr(records, "lives", None))
    report.kernel_file = getattr(records, "kernel_file", None)
    return report


def estimate(kernel, *args, machine=None, **kwargs) -> Report:
    """Run ``kernel`` once on ``args`` (NumPy arrays or ``nki.typing.tensor`` specs) and return the
    performance model's ``Report`` (latency, MFU, MBU, engine utilisation, ``timeline()``)."""
    m = resolve_machine(machine) if machine is not None else None
    args, kwargs = materialize(args, kwargs)
    _, records, used, _ = run_profiled(kernel, args, kwargs, target=m)
    return model(records, used, _kernel_name(kernel))


def timeline(kernel, *args, machine=None, **kwargs) -> list:
    """The modelled per-engine instruction timeline of one launch: a list of dicts
    (``engine``, ``start``, ``end`` in ns, ``name``, ``source`` as file:line, ...)."""
    return estimate(kernel, *args, machine=machine, **kwargs).timeline()


def _kernel_name(kernel):
    fn = getattr(kernel, "fn", kernel)
    return getattr(fn, "__name__", "kernel")


def materialize(args, kwargs):
    """Kernel arguments as arrays: ``nki.typing.tensor[shape, dtype]`` specs become zero-filled arrays,
    torch tensors host copies."""
    def conv(v):
        if isinstance(v, TensorSpec):
            return v.zeros()
        if type(v).__module__.split(".")[0] == "torch" and hasattr(v, "detach"):
            from .torch_bridge import host_view  # the torch side of NKI loads on first use (nki/__init__.py)
            return np.array(host_view(v.detach().cpu()))
        if isinstance(v, list) and any(isinstance(x, TensorSpec) for x in v):
            return [conv(x) for x in v]
        if isinstance(v, tuple) and any(isinstance(x, TensorSpec) for x in v):
            return tuple(conv(x) for x in v)
        return v
    return [conv(a) for a in args], {k: conv(v) for k, v in kwargs.items()}


# ------------------------------------------------------------- trace files

def chrome_trace(report: Report) -> dict:
    """The timeline in the Trace Event format (chrome://tracing, Perfetto): one row per engine."""
    tids = {e: i for i, e in enumerate(ENGINES)}
    events = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tids[e], "args": {"name": e}} for e in ENGINES]
    for ev in report.timeline():
        events.append({"name": ev["name"], "cat": ev["engine"], "ph": "X", "pid": 0, "tid": tids[ev["engine"]],
                       "ts": ev["start"] / 1e3, "dur": max(ev["end"] - ev["start"], 0.0) / 1e3,
                       "args": {"source": ev["source"], "instance": list(ev["instance"]), "step": ev["step"]}})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"format": "torchneuron-nki-trace", **report.to_dict()}}


def write_trace(report: Report, path: str):
    """Write the kernel's modelled instruction trace (JSON, Trace Event format plus the report)."""
    data = chrome_trace(report)
    data["instructions"] = report.timeline()
    data["neuronNkiKernels"] = [report.nki_trace()]
    with open(path, "w") as f:
        json.dump(data, f, default=_json_default)


def add_to_profiler(prof, *reports):
    """Put the reports' instruction traces into a ``torch.profiler.profile`` trace (its
    ``neuronNkiKernels`` metadata, which the explorer's NKI view draws)."""
    prof.add_metadata_json("neuronNkiKernels", json.dumps([r.nki_trace() for r in reports], default=_json_default))


def write_summary(report: Report, path: str, **extra):
    with open(path, "w") as f:
        json.dump({**report.to_dict(), **extra}, f, indent=1, default=_json_default)


def _json_default(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, tuple):
        return list(v)
    return str(v)

