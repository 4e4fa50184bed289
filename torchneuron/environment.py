"""Every environment variable torchneuron knows: TorchNeuron's (``TORCH_NEURONX_*``),
the Neuron runtime's and tools' (``NEURON_*`` and a few others), and the project's
own (``TORCHNEURON_*``), each with its parser, its default, what it means on
Trainium and what this device does with it (docs/environment.md is this table).

Read access for the rest of the code::

    environment.flag("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY")  # -> bool
    environment.value("TORCH_NEURONX_DEBUG_DIR")                    # -> parsed value or default

Both read the environment at the call and raise :class:`ConfigError` naming the
variable and the values it takes. At import, :func:`check` refuses a malformed
value of a variable read in Python, and warns once about each ``TORCH_NEURONX_*``
or ``NEURON_*`` variable the registry does not know (a typo, most often). The
runtime's own settings (cores, LNC, memory, launch blocking) are checked by the
runtime at the first device use instead (csrc/runtime/config.h), as before: an
invalid one leaves ``torch.neuron.is_available()`` False, and the first use
raises.
"""
from __future__ import annotations

import difflib
import logging
import os
import re
import warnings
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["ConfigError", "Variable", "REGISTRY", "flag", "value", "variable", "known", "check", "logger"]


class ConfigError(RuntimeError):
    """A malformed setting; the message names the variable, its value and what it takes
    (the same form as the runtime's: ``NAME='value' is invalid: expected ...``)."""


# ------------------------------------------------------------------ parsers
class Parser:
    """Turns a variable's text into its value; ``expected`` says what it takes."""

    expected = ""

    def parse(self, text: str) -> Any:
        raise NotImplementedError


class Flag(Parser):
    # As the Neuron runtime reads its booleans (0, 1, false, true) and TorchNeuron's
    # compile settings theirs (also yes, no), in any case.
    expected = "1, true or yes (on), 0, false or no (off)"

    def parse(self, text):
        t = text.strip().lower()
        if t in ("1", "true", "yes"):
            return True
        if t in ("0", "false", "no"):
            return False
        raise ValueError


class Int(Parser):
    def __init__(self, lo: int | None = None, hi: int | None = None):
        self.lo, self.hi = lo, hi
        bounds = f" from {lo}" if lo is not None else ""
        bounds += f" to {hi}" if hi is not None else (" up" if lo is not None else "")
        self.expected = f"a whole number{bounds}"

    def parse(self, text):
        if not re.fullmatch(r"\s*-?\d+\s*", text):
            raise ValueError
        n = int(text)
        if (self.lo is not None and n < self.lo) or (self.hi is not None and n > self.hi):
            raise ValueError
        return n


class Number(Parser):
    expected = "a number >= 0, such as 60 or 0.5 (inf: no limit)"

    def parse(self, text):
        n = float(text)  # ValueError for text that is no number
        if not n >= 0 or text != text.strip():
            raise ValueError
        return n


class Choice(Parser):
    def __init__(self, *choices: str):
        self.choices = choices
        self.expected = "one of " + ", ".join(choices)

    def parse(self, text):
        t = text.strip().lower()
        if t not in self.choices:
            raise ValueError
        return t


class Path(Parser):
    expected = "a path"

    def parse(self, text):
        if not text.strip():
            raise ValueError
        return os.path.expanduser(text)


class Text(Parser):
    expected = "any text"

    def parse(self, text):
        return text


class LogLevel(Parser):
    # TorchNeuron's levels are 0 error, 1 warning, 2 info, 3 debug; launch scripts
    # also write the names, so both forms are taken.
    NAMES = {"error": 0, "warning": 1, "warn": 1, "info": 2, "debug": 3}
    expected = "0 (errors), 1 (warnings), 2 (info), 3 (debug), or ERROR, WARNING, INFO, DEBUG"

    def parse(self, text):
        t = text.strip().lower()
        if t in self.NAMES:
            return self.NAMES[t]
        if t in ("0", "1", "2", "3"):
            return int(t)
        raise ValueError


class CoreList(Parser):
    expected = "core ids such as 0-3, 0,2 or 1"

    def parse(self, text):
        cores = []
        for item in text.replace(" ", "").split(","):
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
            if not m:
                raise ValueError
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            if hi < lo:
                raise ValueError
            cores.extend(range(lo, hi + 1))
        return cores


class MachineName(Parser):
    expected = "trn2 (Trainium2), trn3 (Trainium3) or trn1 (Trainium1), or another name of one (v3, gen3, ...)"

    def parse(self, text):
        from . import _C  # the runtime's reading (the C++ bridge loads after this module checks the settings)

        return _C._machine_model(text)[0]  # ValueError for an unknown name


class Bytes(Parser):
    expected = "a whole byte count such as 4G, 512M or 1048576"

    def parse(self, text):
        m = re.fullmatch(r"(\d{1,15})([KMGT]?)(?:I?B)?", text.strip().upper())
        if not m or int(m.group(1)) == 0:
            raise ValueError
        return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2)]


# ------------------------------------------------------------------ registry
@dataclass(frozen=True)
class Variable:
    """One environment variable.

    ``name`` ending in ``*`` is a family (every name with that prefix).
    ``default``: the text it takes when unset (``None``: none, the value is None),
    ``default_doc`` when the default is not one text (it depends on the machine).
    ``meaning``: what it does on Trainium (TorchNeuron's or the Neuron tools' docs,
    paraphrased). ``here``: what this device does with it.
    ``reader``: who reads it: "python" (checked at import), "runtime" (the C++
    runtime, checked at the first device use), "compile" (the compile backend,
    checked at import), "tests" (the test suite and benchmarks; not checked).
    """

    name: str
    parser: Parser
    group: str
    meaning: str
    here: str
    default: str | None = None
    default_doc: str = ""
    reader: str = "python"

    def parse(self, text: str, name: str | None = None) -> Any:
        try:
            return self.parser.parse(text)
        except (ValueError, TypeError):
            raise ConfigError(f"{name or self.name}={text!r} is invalid: expected {self.parser.expected}") from None

    @property
    def default_text(self) -> str:
        return self.default_doc or (self.default if self.default is not None else "unset")


_NO_EFFECT = "accepted, no effect here"
_NO_COMPILER = "accepted, no effect here: the device compiles nothing to NEFFs (torch.compile runs Inductor's CPU code)"
_NO_HARDWARE = "accepted, no effect here: a setting of the Neuron runtime's hardware path, which the emulator has not"
_COMPILE = ("checked at start-up; what it does is the compile backend's (torchneuron/compile, docs/compile.md), "
            "which reads it through environment.flag/value")
_METRICS = "checked at start-up; what it does is the compile metrics' (torchneuron/compile)"

REGISTRY: tuple[Variable, ...] = (
    # ---- runtime: which cores, how large
    Variable("NEURON_RT_VISIBLE_CORES", CoreList(), "runtime",
             "which NeuronCores (logical core ids) the process claims; a claimed core is the process's alone",
             "the devices: one per listed logical core, in order; ids below 128/LNC (64 at LNC=2), at most 64 of them",
             default="0-1", reader="runtime"),
    Variable("NEURON_RT_NUM_CORES", Int(0), "runtime",
             "how many logical NeuronCores the process claims (the runtime picks free ones); 0 means all; "
             "NEURON_RT_VISIBLE_CORES takes precedence",
             "claims logical cores 0..n-1; 0 or unset: the default set (2 cores, not the instance's all); "
             "ignored, with a warning, when NEURON_RT_VISIBLE_CORES is set; more than the instance has is an error",
             default="0", reader="runtime"),
    Variable("NEURON_LOGICAL_NC_CONFIG", Choice("1", "2"), "runtime",
             "physical NeuronCores grouped into one logical core (LNC): 2 is the default from Trainium2 on "
             "(4 logical cores per Trainium2 device), 1 the only value on Trainium1",
             "a device is a logical core: device_count() counts logical cores, total_memory is LNC times a "
             "physical core's HBM (within the host's share), cores_per_device is the machine's over LNC",
             default_doc="2 on trn2 and trn3, 1 on trn1 (TORCHNEURON_MACHINE)", reader="runtime"),
    Variable("NEURON_RT_VIRTUAL_CORE_SIZE", Choice("1", "2"), "runtime",
             "the runtime's older name of the logical core size, as NEURON_LOGICAL_NC_CONFIG",
             "as NEURON_LOGICAL_NC_CONFIG; both set to different values is an error",
             default_doc="as NEURON_LOGICAL_NC_CONFIG", reader="runtime"),
    Variable("NEURON_LAUNCH_BLOCKING", Flag(), "runtime",
             "1: every operator runs synchronously (errors point at the call that caused them)",
             "the same: every launch runs before it returns", default="0", reader="runtime"),
    # ---- the Neuron runtime's other settings (its configuration guide)
    Variable("NEURON_RT_LOG_LEVEL", Text(), "runtime", "the Neuron runtime's log level (ERROR ... TRACE)",
             "accepted, no effect here: the emulated runtime logs nothing; see TORCH_NEURONX_LOG_LEVEL"),
    Variable("NEURON_RT_LOG_LOCATION", Text(), "runtime", "where the Neuron runtime logs (console or syslog)",
             "accepted, no effect here: the emulated runtime logs nothing"),
    Variable("NEURON_RT_LOG_LEVEL_*", Text(), "runtime", "the runtime's log level per component (TDRV, NMGR, NRT)",
             "accepted, no effect here: the emulated runtime logs nothing"),
    Variable("NEURON_RT_LOG_LOCATION_*", Text(), "runtime", "the runtime's log destination per component",
             "accepted, no effect here: the emulated runtime logs nothing"),
    Variable("NEURON_RT_EXEC_TIMEOUT", Int(0), "runtime", "seconds a NeuronCore may take on one execution",
             "accepted, no effect here: a task runs to its end on the host"),
    Variable("NEURON_RT_VALIDATE_HASH", Flag(), "runtime", "check NEFF contents before loading", _NO_COMPILER),
    Variable("NEURON_RT_MULTI_INSTANCE_SHARED_WEIGHTS", Flag(), "runtime",
             "share the weights of one model loaded on several cores", _NO_COMPILER),
    Variable("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS", Int(0), "runtime",
             "asynchronous executions the runtime keeps in flight (0: off)",
             "accepted, no effect here: eager work is always queued asynchronously (NEURON_LAUNCH_BLOCKING=1 stops it)"),
    Variable("NEURON_RT_ALLOW_LEGACY_NEFF", Flag(), "runtime", "run a NEFF compiled for an older chip", _NO_COMPILER),
    Variable("NEURON_RT_DBG_*", Text(), "runtime", "the runtime's internal diagnostics", _NO_HARDWARE),
    Variable("NEURON_RT_STOCHASTIC_ROUNDING_EN", Flag(), "runtime", "stochastic rounding of downcasts on the device",
             "accepted, no effect here: downcasts round to nearest even, as on the CPU"),
    Variable("NEURON_RT_STOCHASTIC_ROUNDING_SEED", Int(0), "runtime", "seed of stochastic rounding",
             "accepted, no effect here (see NEURON_RT_STOCHASTIC_ROUNDING_EN)"),
    Variable("NEURON_RT_ROOT_COMM_ID", Text(), "distributed", "address:port of rank 0 for the runtime's collectives",
             "accepted, no effect here: torch.distributed's backend neuron rendezvous through MASTER_ADDR/MASTER_PORT"),
    Variable("NEURON_RT_ULTRASERVER_*", Text(), "distributed", "UltraServer topology of the runtime", _NO_HARDWARE),
    Variable("NEURON_RT_ENABLE_DGE_NOTIFICATIONS", Flag(), "runtime", "descriptor-generation-engine notifications",
             _NO_HARDWARE),
    Variable("NEURON_RT_LOCAL_CORE_DUMP_DIRECTORY", Path(), "runtime", "where the runtime writes core dumps",
             _NO_HARDWARE),
    Variable("NEURON_RT_CONTIGUOUS_SCRATCHPAD", Flag(), "runtime", "one contiguous scratchpad per NEFF", _NO_COMPILER),
    Variable("NEURON_RT_DBG_ZEROCOPY", Flag(), "runtime", "internal runtime setting TorchNeuron sets at import",
             _NO_HARDWARE),
    Variable("NEURON_VISIBLE_DEVICES", Text(), "runtime", "the Neuron devices a container sees (device plugin)",
             "accepted, no effect here: use NEURON_RT_VISIBLE_CORES"),
    Variable("NEURON_PLATFORM_TARGET_OVERRIDE", Choice("trn1", "inf2", "gen2", "trn2", "gen3", "trn3", "gen4"), "compile",
             "the chip NKI kernels and the compiler target",
             "accepted, no effect here: the machine model is TORCHNEURON_MACHINE (the NKI emulator's "
             "target=/platform_target= too)"),
    # ---- torch.compile backend (TorchNeuron's reference: the backend for torch.compile)
    Variable("TORCH_NEURONX_DEBUG_DIR", Path(), "compile",
             "where compilation artifacts go (FX graphs, StableHLO, NEFFs, compiler work directories)", _COMPILE,
             default="/tmp/neuron_backend", reader="compile"),
    Variable("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", Flag(), "compile",
             "1: keep the compilation artifacts after execution (for inspecting the IR)", _COMPILE,
             default="0", reader="compile"),
    Variable("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", Flag(), "compile",
             "1 (the default): a graph that fails to compile raises; 0: it runs eagerly instead; the "
             "fallback_execution compile option overrides it", _COMPILE, default="1", reader="compile"),
    Variable("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", Flag(), "compile",
             "1: a CPU tensor passed to a compiled graph raises instead of being copied to the device", _COMPILE,
             default="0", reader="compile"),
    Variable("TORCH_NEURONX_RETAIN_DEVICE_MODE", Flag(), "compile",
             "1: compiled outputs keep the inputs' device placement instead of going to the Neuron device", _COMPILE,
             default="0", reader="compile"),
    Variable("TORCH_NEURONX_COMPLEX_DECOMPOSE", Flag(), "compile",
             "decompose complex-number operators in the framework before lowering (on from PyTorch 2.13)", _COMPILE,
             default="1", reader="compile"),
    Variable("TORCH_NEURONX_NEFF_CACHE_DIR", Path(), "compile", "the persistent cache of compiled NEFFs",
             _NO_COMPILER + "; the compiled-graph cache is Inductor's (TORCHINDUCTOR_CACHE_DIR)", reader="compile"),
    Variable("TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", Path(), "compile",
             "a node-local NEFF cache (named by launch scripts; not in the reference pages read)",
             _NO_COMPILER, reader="compile"),
    Variable("TORCH_NEURONX_DISABLE_NEFF_CACHE", Flag(), "compile", "1: no NEFF cache, everything recompiles",
             _COMPILE, default="0", reader="compile"),
    Variable("NEURON_CC_FLAGS", Text(), "compile", "extra neuronx-cc options (--model-type=..., --lnc=...)",
             _NO_COMPILER, reader="compile"),
    Variable("NEURON_COMPILE_CACHE_URL", Text(), "compile", "the Neuron persistent compile cache (XLA-based torch-neuronx)",
             _NO_COMPILER, reader="compile"),
    Variable("NEURON_FRAMEWORK_DEBUG", Flag(), "profiling",
             "map compiled instructions to Python source in the profiler (set before compiling)",
             "accepted, no effect here: profiler events already carry their operators; "
             "torch.profiler.profile(with_stack=True) records the Python stacks", reader="compile"),
    Variable("NEURON_EXTRACT_GRAPHS_ONLY", Flag(), "compile", "trace graphs only, for parallel ahead-of-time compiles",
             _NO_COMPILER, reader="compile"),
    Variable("NKI_DEBUG_INFO", Flag(), "profiling", "record NKI source locations in the NEFF for the profiler",
             "accepted, no effect here: the NKI emulator's errors and reports already name source lines",
             default="0", reader="compile"),
    Variable("XLA_IR_DEBUG", Flag(), "profiling", "descriptive operator names in profiles (XLA IR)",
             "accepted, no effect here: no XLA", default="0"),
    Variable("XLA_HLO_DEBUG", Flag(), "profiling", "descriptive layer names in profiles (XLA HLO)",
             "accepted, no effect here: no XLA", default="0"),
    # ---- eager / general
    Variable("TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS", Flag(), "eager",
             "1: fall back to the CPU only for operators without a Neuron implementation; an operator that "
             "fails on the device raises instead of being retried on the CPU",
             "this device always behaves as 1, under both values: a failing operator raises (at the call or the "
             "next synchronising call), never retried on the CPU; the one fallback, for operators whose output "
             "size is unknown before they run, stays (TORCHNEURON_STRICT_FALLBACK=1 makes it an error)",
             default="0"),
    Variable("TORCH_NEURONX_ENABLE_STACK_TRACE", Flag(), "eager",
             "1: record the Python stack of every operator (costs time)",
             "accepted, no effect here: for an error's Python stack run with NEURON_LAUNCH_BLOCKING=1 (the error "
             "raises at the call); for stacks per operator, torch.profiler.profile(with_stack=True)",
             default="0"),
    Variable("TORCH_NEURONX_LOG_LEVEL", LogLevel(), "eager",
             "TorchNeuron's log level: 0 errors, 1 warnings, 2 info, 3 debug",
             "the level of the logger 'torchneuron' (0 ERROR, 1 WARNING, 2 INFO, 3 DEBUG), logging to stderr "
             "when set; INFO lists the TorchNeuron settings that have no effect here, DEBUG every known "
             "setting found", default="0"),
    Variable("TORCH_NEURONX_LOG_FILE", Path(), "eager", "a file TorchNeuron's log goes to (appended) instead",
             "the same, for the logger 'torchneuron'"),
    Variable("TORCH_NEURONX_ENABLE_ASYNC_NRT", Flag(), "eager",
             "asynchronous runtime execution, overlapping compute and communication",
             "accepted, no effect here: device work is always asynchronous (NEURON_LAUNCH_BLOCKING=1 stops it)",
             default="1"),
    Variable("TORCH_NEURONX_ENABLE_HOST_CC", Flag(), "distributed", "collectives through the host",
             "accepted, no effect here: the backend neuron's collectives always run on the host (gloo)",
             default="0"),
    Variable("TORCH_NEURONX_MLIR_ATEN_OPS", Flag(), "eager", "internal: eager operators lowered through MLIR",
             "accepted, no effect here: operators run on the host's kernels", default="1"),
    # ---- metrics
    Variable("TORCH_NEURONX_ENABLED_METRIC_TABLES", Text(), "metrics",
             "comma list of metric tables written as CSV (graph_stats)", _METRICS,
             default="", reader="compile"),
    Variable("TORCH_NEURONX_METRICS_DIR", Path(), "metrics", "directory of the metric CSV files",
             _METRICS, default="/tmp", reader="compile"),
    # ---- distributed
    Variable("NEURON_USE_SPLIT_ALLGATHER", Flag(), "distributed", "split-based all-gather, to save memory",
             "accepted, no effect here: collectives run through gloo on host views of device memory", default="1"),
    Variable("NEURON_USE_SPLIT_REDUCE_SCATTER", Flag(), "distributed", "split-based reduce-scatter",
             "accepted, no effect here: collectives run through gloo on host views of device memory", default="1"),
    Variable("COLLECTIVE_BUCKETSIZE_IN_MB", Int(1), "distributed", "largest bucket of a bucketed collective, in MiB",
             "accepted, no effect here: collectives are not bucketed by the backend", default="512"),
    Variable("COLLECTIVE_MIN_BUCKETS", Int(0), "distributed", "above 1: small tensors are split into this many buckets",
             "accepted, no effect here: collectives are not bucketed by the backend", default="0"),
    # ---- profiling (Neuron Explorer's variables)
    Variable("NEURON_RT_INSPECT_*", Text(), "profiling",
             "runtime profile capture for Neuron Explorer (ENABLE, OUTPUT_DIR, DEVICE_PROFILE, SYSTEM_PROFILE, "
             "SYS_TRACE_MAX_EVENTS_PER_NC, ...)",
             "accepted, no effect here: profile with torch.profiler (ProfilerActivity.PrivateUse1 shows the "
             "device's tasks) and the explorer report (docs/explorer.md)"),
    Variable("NEURON_RT_INSPECT_ENABLE", Flag(), "profiling", "switch on runtime profile capture",
             "accepted, no effect here (see NEURON_RT_INSPECT_*)", default="0"),
    Variable("NEURON_RT_INSPECT_OUTPUT_DIR", Path(), "profiling", "where runtime profiles are written",
             "accepted, no effect here (see NEURON_RT_INSPECT_*)", default="./output"),
    Variable("NEURON_RT_INSPECT_DEVICE_PROFILE", Choice("0", "1", "model", "session"), "profiling",
             "device traces: 0 off, 1/model first execution per NEFF, session everything",
             "accepted, no effect here (see NEURON_RT_INSPECT_*)", default="0"),
    Variable("NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC", Int(1), "profiling",
             "largest number of system trace events per core", "accepted, no effect here (see NEURON_RT_INSPECT_*)",
             default="1000000"),
    # ---- the project's own
    Variable("TORCHNEURON_MACHINE", MachineName(), "torchneuron",
             "", "the machine model: trn2 (Trainium2, NeuronCore-v3), trn3 (Trainium3, NeuronCore-v4), trn1 "
             "(Trainium1, NeuronCore-v2), or another name of one (v3, gen3, trainium2, ...); read by the runtime "
             "and the NKI emulator", default="trn2", reader="runtime"),
    Variable("TORCHNEURON_NKI_TARGET", MachineName(), "torchneuron", "",
             "the NKI emulator's second name for TORCHNEURON_MACHINE", reader="runtime"),
    Variable("TORCHNEURON_TARGET", Choice("off", "trn2", "trn3"), "torchneuron", "",
             "the Trainium twin: trn2 or trn3 models the target's behaviour, compiles, time and cost "
             "(docs/target.md); read at import", default="off"),
    Variable("TORCHNEURON_TARGET_64BIT", Choice("warn", "narrow", "off"), "torchneuron", "",
             "the twin's 64-bit rule: warn names the first value the target's 32-bit narrowing changes, "
             "narrow computes as the target does (docs/target.md)", default="warn"),
    Variable("TORCHNEURON_HBM_BYTES", Bytes(), "torchneuron", "",
             "device memory per logical core (512M, 8G, 1T, bytes), all cores together within the host's memory",
             default_doc="the machine's HBM per logical core, at most a core's share of half the host's memory",
             reader="runtime"),
    Variable("TORCHNEURON_EXIT_TIMEOUT", Number(), "torchneuron", "",
             "seconds queued work may run at interpreter exit before it is cancelled", default="60",
             reader="runtime"),
    Variable("TORCHNEURON_STRICT_FALLBACK", Flag(), "torchneuron", "",
             "1: the synchronous fallback raises instead", default="0", reader="runtime"),
    Variable("TORCHNEURON_DEBUG_META", Text(), "torchneuron", "", "set: print why an operator's meta pass failed",
             reader="runtime"),
    Variable("TORCHNEURON_MEMCHECK", Text(), "torchneuron", "",
             "1: the device memory checker raises its reports; warn: it warns (docs/sanitizers.md)", reader="runtime"),
    Variable("TORCHNEURON_STREAM_SANITIZER", Text(), "torchneuron", "",
             "1: the stream sanitizer raises on unordered accesses from two streams; warn: it warns", reader="runtime"),
    Variable("TORCHNEURON_DEVICE_TANH", Flag(), "torchneuron", "",
             "1: float32 tanh is the device's own function (docs/numerics.md); read at import", default="0",
             reader="runtime"),
    Variable("TORCHNEURON_ADAPTIVE_EAGER", Flag(), "torchneuron", "",
             "0: no fusion of queued element-wise work", default="1", reader="runtime"),
    Variable("TORCHNEURON_NKI_DEBUG", Flag(), "torchneuron", "", "NKI emulator: uninitialised memory is NaN/garbage",
             default="0", reader="runtime"),
    Variable("TORCHNEURON_NKI_TRACE_CACHE", Flag(), "torchneuron", "", "NKI emulator: 0 interprets every call",
             default="1", reader="runtime"),
    Variable("TORCHNEURON_NKI_FAST_REPLAY", Flag(), "torchneuron", "", "NKI emulator: replay recorded programs fast",
             default="1", reader="runtime"),
    Variable("TORCHNEURON_NKI_BF16_GEMM", Flag(), "torchneuron", "", "NKI emulator: 0 keeps bf16 matmuls off the "
             "host's bf16 GEMM", default="1", reader="runtime"),
    Variable("TORCHNEURON_NKI_BENCHMARK_SECONDS", Number(), "torchneuron", "",
             "NKI emulator: seconds nki.benchmark runs", default="10", reader="runtime"),
    # ---- read by the tests and benchmarks
    Variable("TORCHNEURON_FUZZ_PROGRAMS", Int(0), "tests", "", "fuzzed programs per test (0: the CI count)",
             default="0", reader="tests"),
    Variable("TORCHNEURON_FUZZ_SEED", Int(0), "tests", "", "the first fuzzer seed", default="0", reader="tests"),
    Variable("TORCHNEURON_FUZZ_RAW", Flag(), "tests", "", "1: report known fuzzer findings too", default="0",
             reader="tests"),
    Variable("TORCHNEURON_FUSION_PROGRAMS", Int(0), "tests", "", "random programs of the fusion test", default="1500",
             reader="tests"),
    Variable("TORCHNEURON_TANH_STRIDE", Int(1), "tests", "", "stride of the tanh sweep", default="61", reader="tests"),
    Variable("TORCHNEURON_THREAD_RESULTS", Int(1), "tests", "", "results per thread test", default="2000",
             reader="tests"),
    Variable("TORCHNEURON_SOAK_STEPS", Int(0), "tests", "", "steps of the soak benchmark (0: its own count)",
             default="0", reader="tests"),
    Variable("TORCHNEURON_UPSTREAM", Choice("sample", "full"), "tests", "",
             "PyTorch's own test files: CI's fixed sample or the files whole", default="sample", reader="tests"),
    Variable("TORCHNEURON_UPSTREAM_SAMPLE_SCALE", Number(), "tests", "", "PyTorch's own test files: times the sample",
             default="1", reader="tests"),
    Variable("TORCHNEURON_UPSTREAM_JOBS", Int(1), "tests", "", "PyTorch's own test files: worker processes",
             default="2", reader="tests"),
    Variable("TORCHNEURON_UPSTREAM_REPORT", Path(), "tests", "", "PyTorch's own test files: where the report goes",
             default="tests/upstream/REPORT.md", reader="tests"),
    Variable("TORCHNEURON_UPSTREAM_CACHE", Path(), "tests", "", "PyTorch's own test files: where they are fetched to",
             default=".cache/upstream", reader="tests"),
    Variable("TORCHNEURON_UPSTREAM_DEBIAN_VERSION", Text(), "tests", "",
             "PyTorch's own test files: the Debian source package's version", default="2.6.0+dfsg-7", reader="tests"),
    Variable("TORCHNEURON_UPSTREAM_DEBIAN_SUITE", Text(), "tests", "",
             "PyTorch's own test files: the Debian suite serving that version", default="trixie", reader="tests"),
)

_BY_NAME = {v.name: v for v in REGISTRY if not v.name.endswith("*")}
_FAMILIES = tuple(v for v in REGISTRY if v.name.endswith("*"))
# Names whose unknown members are reported: TorchNeuron's and the Neuron tools' prefixes.
_WATCHED = ("TORCH_NEURONX_", "NEURON_")
# What the runtime made of its settings, by variable (torchneuron._C._runtime_config()).
_RUNTIME_VALUES = {
    "NEURON_RT_VISIBLE_CORES": "visible_cores",
    "NEURON_RT_NUM_CORES": "num_cores",
    "NEURON_LOGICAL_NC_CONFIG": "lnc",
    "NEURON_RT_VIRTUAL_CORE_SIZE": "lnc",
    "NEURON_LAUNCH_BLOCKING": "launch_blocking",
    "TORCHNEURON_MACHINE": "machine",
    "TORCHNEURON_HBM_BYTES": "hbm_bytes",
}


def variable(name: str) -> Variable:
    """The registry's entry for ``name`` (a family's for a member of one); ``KeyError``
    naming the closest known names if it has none."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    for family in _FAMILIES:
        if name.startswith(family.name[:-1]):
            return family
    raise KeyError(f"{name} is not a variable torchneuron knows{_suggestion(name)}")


def known(name: str) -> bool:
    try:
        variable(name)
        return True
    except KeyError:
        return False


def value(name: str) -> Any:
    """The value of ``name`` now: parsed from the environment, else its default (None
    without one). The runtime's settings (cores, LNC, machine, memory, launch
    blocking) answer what the runtime made of them, defaults resolved; their errors
    are the runtime's (``RuntimeError``)."""
    var = variable(name)
    if name in _RUNTIME_VALUES:
        from . import _C  # (loads after this module: see MachineName.parse)

        return _C._runtime_config()[_RUNTIME_VALUES[name]]
    text = os.environ.get(name)
    if text is None or (text == "" and not isinstance(var.parser, Text)):
        return None if var.default is None else var.parse(var.default, name)
    return var.parse(text, name)


def flag(name: str) -> bool:
    """The on/off setting ``name`` (a variable with a Flag parser), its default if unset."""
    var = variable(name)
    if not isinstance(var.parser, Flag):
        raise TypeError(f"{name} is not an on/off setting (it takes {var.parser.expected})")
    return bool(value(name))


def _suggestion(name: str) -> str:
    close = difflib.get_close_matches(name, list(_BY_NAME), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def logger() -> logging.Logger:
    """The logger 'torchneuron', at the level TORCH_NEURONX_LOG_LEVEL sets."""
    return logging.getLogger("torchneuron")


_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}


def _configure_logging() -> None:
    log = logger()
    level_set = bool(os.environ.get("TORCH_NEURONX_LOG_LEVEL"))
    path = value("TORCH_NEURONX_LOG_FILE")
    if level_set:
        log.setLevel(_LEVELS[value("TORCH_NEURONX_LOG_LEVEL")])
    if (level_set or path) and not log.handlers:
        handler = logging.FileHandler(path) if path else logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[torchneuron] %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.propagate = False


def check(environ: dict[str, str] | None = None) -> None:
    """Start-up check of the environment (run once, at import of torchneuron): a
    malformed value of a variable read in Python raises :class:`ConfigError`; an
    unknown ``TORCH_NEURONX_*``/``NEURON_*`` name warns, with the closest known name."""
    environ = os.environ if environ is None else environ
    found = []
    for name in sorted(environ):
        text = environ[name]
        if not known(name):
            if name.startswith(_WATCHED):
                warnings.warn(f"{name} is set but is not a variable TorchNeuron or torchneuron knows; it has no "
                              f"effect{_suggestion(name)}", stacklevel=2)
            continue
        var = variable(name)
        # The runtime checks its own at the first device use, and the tests theirs.
        if var.reader not in ("runtime", "tests") and text != "":
            var.parse(text, name)
        found.append((name, text, var))
    if environ.get("NEURON_RT_VISIBLE_CORES") and environ.get("NEURON_RT_NUM_CORES", "0").strip() not in ("", "0"):
        warnings.warn("NEURON_RT_NUM_CORES is ignored: NEURON_RT_VISIBLE_CORES is set and takes precedence, as on "
                      "the Neuron runtime", stacklevel=2)
    _configure_logging()
    log = logger()
    for name, text, var in found:
        log.debug("%s=%r: %s", name, text, var.here)
        if var.here.startswith(_NO_EFFECT):
            log.info("%s=%r has no effect on this device: %s", name, text, var.here[len(_NO_EFFECT):].lstrip(": "))
