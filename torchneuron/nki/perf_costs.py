"""The performance model's costs: the engine each instruction record is charged to, and for how long.

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
"""
from __future__ import annotations

from . import dtypes as _dt
from .machine import Buffer, Machine
from .recorder import Record

# the engines an instruction is charged to, in the order reports list them
ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")

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
