"""Every figure the Trainium twin's model uses, with its source.

Per-NeuronCore figures (TensorEngine TFLOPS per dtype class, engine clocks and
rates, HBM per device and its bandwidth) are the NKI emulator's machine models
(``torchneuron/nki/machine.py``), taken from AWS's NKI architecture guides for
NeuronCore-v3 (Trainium2) and NeuronCore-v4 (Trainium3); this file derives a
logical core's figures from them and adds what the model needs above one
kernel. A figure AWS does not publish is marked ``assumed``: the report lists
those with every result they enter.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..nki.machine import MACHINES, Machine

# Chips per instance and the instance names AWS sells (AWS Neuron docs, "Amazon EC2
# Trn2 Architecture": trn2.48xlarge and trn2u.48xlarge have 16 Trainium2 chips, a
# Trn2 UltraServer 64; "Amazon EC2 Trn3 Architecture": a Gen1 UltraServer 64 Trainium3
# chips, a Gen2 UltraServer 144).
INSTANCES = {
    "trn2": {"trn2.48xlarge": 16, "trn2u.48xlarge": 16, "Trn2 UltraServer": 64},
    "trn3": {"Trn3 Gen1 UltraServer": 64, "Trn3 Gen2 UltraServer": 144},
}

# NeuronLink bandwidth per chip, bytes per second (AWS Neuron docs, "Trainium2 Architecture":
# NeuronLink-v3, 1.28 TB/s per chip; "Trainium3 Architecture": NeuronLink-v4, 2.56 TB/s per chip).
LINK_BYTES_PER_S = {"trn2": 1.28e12, "trn3": 2.56e12}

# Per-launch cost of one eager operator or compiled graph on the device: the
# runtime's execute call and its DMA descriptors. Assumed (AWS publishes no figure).
LAUNCH_US = {"trn2": 15.0, "trn3": 15.0}
# Latency of one collective, beside its bandwidth term (``roofline.collective_cost``).
# Calibrated, not published: the median, over the token-generation (TPOT) rows of
# benchmarks/target_calibration.md, of measured minus modelled time per tensor-parallel
# collective; that gap also holds the serving loop's per-token work. Trainium3: Trainium2's.
COLLECTIVE_LATENCY_US = {"trn2": 93.0, "trn3": 93.0}
# Operators one fused eager launch holds at most (eager_fusion.py). Assumed: AWS publishes
# no bound for TorchNeuron's adaptive eager; this is the emulator's own fusion window's.
FUSED_OPS_MAX = 16
# Compile time of one new eager operator signature, and of one compiled graph (a
# fixed part plus a part per FX node). Assumed: AWS's docs describe first compiles as
# taking minutes for whole models without a per-graph figure.
EAGER_COMPILE_S = 1.0
GRAPH_COMPILE_S = 20.0
GRAPH_COMPILE_S_PER_NODE = 0.05
# Distinct signatures of one operator at one Python line before the twin calls it
# shape churn (each is a compile on the target).
CHURN_SIGNATURES = 4

# The dtypes a target's NeuronCores compute in (AWS Neuron docs, "Data Types": FP32, TF32,
# BF16, FP16, cFP8 (e4m3, e5m2) and integers on NeuronCore-v3; NeuronCore-v4 adds the MXFP8
# and MXFP4 microscaling formats, whose elements and scales these torch dtypes hold).
_V3_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float64", "bool",
              "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64")
DTYPES = {"trn2": _V3_DTYPES, "trn3": _V3_DTYPES + ("float8_e8m0fnu", "float4_e2m1fn_x2")}

ASSUMED = {
    "launch_us": "per-launch cost of an operator or graph (LAUNCH_US)",
    "eager_compile_s": "compile time of a new eager operator signature (EAGER_COMPILE_S)",
    "graph_compile_s": "compile time of a graph: GRAPH_COMPILE_S + GRAPH_COMPILE_S_PER_NODE per node",
    "collective_latency_us": "latency of one collective (COLLECTIVE_LATENCY_US), calibrated on published "
                             "token-generation latencies",
    "eager_fusion": "adaptive eager fuses an element-wise operator into the launch of the one before it when it "
                    "reads that one's result, up to FUSED_OPS_MAX operators",
    "host": "the host's work between device operators is this machine's CPU time for it (the target's host "
            "taken as fast)",
}


@dataclass(frozen=True)
class LogicalCore:
    """What one logical NeuronCore (``lnc`` physical cores) of a target offers."""

    machine: Machine
    lnc: int

    @property
    def key(self) -> str:
        return self.machine.key

    def tensor_flops_per_s(self, dtype_class: str) -> float:
        """TensorEngine peak for inputs of a class: "fp32", "bf16" (also fp16, tf32) or "fp8"."""
        tflops = self.machine.tensor_tflops
        return tflops.get(dtype_class, tflops["fp32"]) * 1e12 * self.lnc

    def engine_elements_per_s(self, engine: str, two_byte: bool) -> float:
        """Elements per second a Vector/Scalar/GpSimd engine processes: its rate per
        partition per cycle (the faster one for 2-byte types), 128 partitions, its clock."""
        rate = {"vector": self.machine.vector_rate, "scalar": self.machine.scalar_rate,
                "gpsimd": self.machine.gpsimd_rate}[engine][1 if two_byte else 0]
        return rate * self.machine.partitions * self.machine.clock_ghz[engine] * 1e9 * self.lnc

    @property
    def hbm_bytes_per_s(self) -> float:
        m = self.machine
        return m.hbm_bytes_per_s_per_device / m.cores_per_device * self.lnc

    @property
    def hbm_bytes(self) -> int:
        return self.machine.hbm_bytes_per_core * self.lnc

    @property
    def link_bytes_per_s(self) -> float:
        """A logical core's share of its chip's NeuronLink bandwidth."""
        return LINK_BYTES_PER_S[self.key] / self.cores_per_chip

    @property
    def launch_s(self) -> float:
        return LAUNCH_US[self.key] * 1e-6

    @property
    def collective_latency_s(self) -> float:
        return COLLECTIVE_LATENCY_US[self.key] * 1e-6

    @property
    def cores_per_chip(self) -> int:
        return self.machine.cores_per_device // self.lnc


TARGETS = ("trn2", "trn3")


def logical_core(target: str, lnc: int = 2) -> LogicalCore:
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}: expected one of {', '.join(TARGETS)}")
    if lnc not in (1, 2):
        raise ValueError(f"logical core size {lnc!r}: expected 1 or 2")
    return LogicalCore(MACHINES[target], lnc)
