"""The rules table: every kind of line that ties a PyTorch program to CUDA.

Each :class:`Rule` says what the line ties and to whom, the device-neutral
rewrite, whether ``--fix`` makes it, and the guard to put around the line when
it cannot be rewritten. The detector (detect.py) decides which rule a node
falls under and, per finding, whether that occurrence is fixable: a rule
marked ``fixable`` can still meet a form it cannot rewrite (a positional
argument a neutral function does not take, say), and then the finding says so.

Rewrites use ``torch.accelerator`` (the current accelerator, its devices,
streams and memory), ``torch.get_device_module()`` (the accelerator's device
module, for what ``torch.accelerator`` does not cover), ``torch.Stream`` and
``torch.Event``, ``torch.autocast`` and ``torch.amp``.
"""
from __future__ import annotations

from dataclasses import dataclass

NVIDIA = "NVIDIA"


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    ties: str        # what the line ties the program to
    vendor: str      # to whom
    rewrite: str     # the device-neutral form
    fixable: bool    # whether --fix rewrites it (per finding, detect.py can say no)
    guard: str       # what to do by hand when it is not rewritten
    #: the tie needs no CUDA name: a kernel language, a package, a checkpoint or an argument
    #: that only CUDA (or NCCL) takes; the report counts such lines as their own class
    implicit: bool = False


RULES: dict[str, Rule] = {r.id: r for r in (
    Rule("TNL001", "cuda-method", "`.cuda()` moves a tensor or module to a CUDA device", NVIDIA,
         "`.to(torch.accelerator.current_accelerator())`", True,
         "move with `.to(device)`, `device` chosen once from `torch.accelerator`"),
    Rule("TNL002", "is-cuda", "`.is_cuda` asks whether a tensor is on a CUDA device", NVIDIA,
         "`x.device.type == torch.accelerator.current_accelerator().type`", True,
         "compare `x.device.type` with the accelerator's type"),
    Rule("TNL003", "cuda-device-string", "a `\"cuda\"` device string names the CUDA device type", NVIDIA,
         "`torch.accelerator.current_accelerator().type` (`\"cuda:N\"`: an f-string of it and N)", True,
         "build the device from `torch.accelerator.current_accelerator()`"),
    Rule("TNL004", "torch-cuda-api", "`torch.cuda.*` is the CUDA device module", NVIDIA,
         "`torch.accelerator.*`, `torch.Stream`/`torch.Event`, or `torch.get_device_module().*`", True,
         "`if torch.backends.cuda.is_built():` around what only CUDA has"),
    Rule("TNL005", "torch-cuda-import", "an import of `torch.cuda` or of names from it", NVIDIA,
         "import nothing from `torch.cuda`; use the neutral names through `torch`", True,
         "keep the import next to the CUDA-only code it serves, under its guard"),
    Rule("TNL006", "cuda-amp", "`torch.cuda.amp` autocast and gradient scaling are CUDA's", NVIDIA,
         "`torch.autocast(device_type=..., dtype=torch.float16)`, `torch.amp.GradScaler(device_type)`, "
         "`torch.amp.custom_fwd(device_type=...)`", True,
         "pass the accelerator's type to `torch.autocast` and `torch.amp`"),
    Rule("TNL007", "cudnn-setting", "`torch.backends.cudnn` settings configure NVIDIA's cuDNN library", NVIDIA,
         "none: they only affect cuDNN", False,
         "`if torch.backends.cudnn.is_available():` around the setting"),
    Rule("TNL008", "backends-cuda-setting", "`torch.backends.cuda` settings configure CUDA's BLAS and attention "
         "kernels", NVIDIA,
         "`torch.set_float32_matmul_precision(...)` for `matmul.allow_tf32`; "
         "`torch.nn.attention.sdpa_kernel(...)` for the attention kernels", True,
         "`if torch.backends.cuda.is_built():` around the setting"),
    Rule("TNL009", "cuda-graphs", "CUDA graphs capture and replay CUDA streams", NVIDIA,
         "`torch.accelerator.Graph` where the device supports graphs", False,
         "`if torch.accelerator.current_accelerator().type == \"cuda\":` around the capture, eager otherwise"),
    Rule("TNL010", "nccl-backend", "the `\"nccl\"` process-group backend is NVIDIA's collective library", NVIDIA,
         "`init_process_group()` with no backend: PyTorch picks the device's own", True,
         "`if torch.distributed.is_nccl_available():` around what needs NCCL"),
    Rule("TNL011", "nccl-env", "an `NCCL_*` environment variable configures NVIDIA's NCCL", NVIDIA,
         "none: it only affects NCCL", False,
         "`if torch.distributed.is_nccl_available():` around the setting"),
    Rule("TNL012", "cuda-visible-devices", "`CUDA_VISIBLE_DEVICES` selects CUDA devices", NVIDIA,
         "`torch.accelerator.set_device_index(i)`, or the next vendor's own variable", False,
         "select the device in code through `torch.accelerator`"),
    Rule("TNL013", "cuda-env", "a `CUDA_*`/`PYTORCH_CUDA_*` environment variable configures the CUDA runtime or "
         "PyTorch's CUDA allocator", NVIDIA,
         "none: it only affects CUDA", False,
         "`if torch.backends.cuda.is_built():` around the setting"),
    Rule("TNL014", "pin-memory-device", "`pin_memory_device=` pins host memory for one named device type", NVIDIA,
         "`pin_memory=True` alone pins for the current accelerator", True,
         "drop the argument"),
    Rule("TNL015", "integer-device-map", "an integer in a `device_map` means GPU N to Hugging Face libraries",
         NVIDIA, "`torch.device(torch.accelerator.current_accelerator().type, N)`", True,
         "name the device with the accelerator's type"),
    Rule("TNL016", "compile-cuda-graphs", "a `torch.compile` mode or option that assumes CUDA graphs", NVIDIA,
         "`mode=\"max-autotune-no-cudagraphs\"`; for `reduce-overhead`, the device's own compile backend", True,
         "choose the mode by `torch.accelerator.current_accelerator().type`"),
    Rule("TNL017", "cuda-extension", "a C++ extension built with CUDA sources (`CUDAExtension`, `cuda_sources`)",
         NVIDIA, "none: CUDA kernels need a port to the device", False,
         "build the CUDA extension only when `torch.utils.cpp_extension.CUDA_HOME` is set, with a fallback"),
    Rule("TNL018", "cuda-only-package", "an import of a package that runs only on NVIDIA GPUs", NVIDIA,
         "none: a device-neutral implementation of what it provides", False,
         "`try: import pkg` / `except ImportError:` with a fallback", implicit=True),
    Rule("TNL019", "flash-attention-impl", "`attn_implementation=\"flash_attention_*\"` needs the flash_attn "
         "CUDA kernels", NVIDIA, "`attn_implementation=\"sdpa\"`", True,
         "choose `\"sdpa\"` unless flash_attn imports"),
    Rule("TNL020", "cuda-version", "`torch.version.cuda` is CUDA's toolkit version", NVIDIA,
         "`torch.accelerator.is_available()` where it tests for an accelerator", False,
         "read it only under `if torch.backends.cuda.is_built():`"),
    Rule("TNL021", "cuda-tensor-type", "a `torch.cuda.*Tensor` type is a CUDA tensor of one dtype", NVIDIA,
         "`torch.tensor(..., dtype=..., device=torch.accelerator.current_accelerator())`", False,
         "build tensors with `dtype=` and `device=`"),
    Rule("TNL022", "nvidia-smi", "`nvidia-smi` is NVIDIA's device tool", NVIDIA,
         "`torch.accelerator.device_count()`, `torch.accelerator.memory_stats()`", False,
         "run it only when `shutil.which(\"nvidia-smi\")` finds it"),
    Rule("TNL023", "profiler-cuda", "`ProfilerActivity.CUDA` (or `use_cuda=`) profiles CUDA kernels", NVIDIA,
         "`torch.profiler.supported_activities()`, which holds the device's own activity", False,
         "profile the activities `torch.profiler.supported_activities()` gives"),
    Rule("TNL024", "load-without-map-location", "`torch.load()` without `map_location` puts tensors back on the "
         "device they were saved from: a checkpoint saved on CUDA fails to load without CUDA", NVIDIA,
         "`torch.load(path, map_location=device)`", False,
         "pass `map_location=` the device the program runs on (or \"cpu\")", implicit=True),
    Rule("TNL025", "barrier-device-ids", "`dist.barrier(device_ids=...)` takes device ids for NCCL's barrier",
         NVIDIA, "`dist.barrier()`: the backend picks the current device", True,
         "drop `device_ids=`, or pass `device_id=` to `init_process_group`", implicit=True),
    Rule("TNL026", "data-parallel", "`nn.DataParallel` replicates a module over the GPUs of one process, on the "
         "path every run takes", NVIDIA,
         "`DistributedDataParallel`, or `DataParallel` only under `torch.accelerator.device_count() > 1`", False,
         "`if torch.accelerator.device_count() > 1:` around it", implicit=True),
    Rule("TNL027", "fp8-scaled-mm", "`torch._scaled_mm` is an fp8 matrix multiply made for NVIDIA's fp8 tensor "
         "cores (compute capability 8.9 and later)", NVIDIA,
         "`torch.matmul` in bfloat16 where the device has no fp8 kernel", False,
         "take the fp8 path only where `torch._scaled_mm` runs, a bfloat16 matmul otherwise", implicit=True),
    Rule("TNL028", "triton-kernel", "a Triton kernel (`@triton.jit`) compiles for NVIDIA (or AMD) GPUs", NVIDIA,
         "the kernel in torch operators (`torch.compile` generates one), or the device's own kernel language",
         False, "launch it only for tensors on a device Triton supports, with a torch fallback", implicit=True),
)}


@dataclass(frozen=True)
class Neutral:
    """The device-neutral replacement of one ``torch.cuda`` name.

    ``target`` uses ``{torch}`` for the module's name of torch. With
    ``positional_only`` the target takes its arguments by position only
    (``torch.accelerator``'s functions), so a keyword argument is turned into
    a positional one; ``max_positional`` limits the positional arguments a
    call may pass (``torch.Event`` takes its options by keyword only).
    ``cpu_value``: what the ``torch.cuda`` call gives on a machine without CUDA,
    where it is a no-op or a constant and the neutral call would raise (no
    accelerator: ``torch.accelerator`` raises, ``torch.get_device_module()`` is
    ``torch.cpu``, which has no generator); the rewrite then calls the neutral
    one only under ``torch.accelerator.is_available()`` and gives this otherwise."""
    target: str
    positional_only: bool = False
    max_positional: int | None = None
    cpu_value: str | None = None


def _accelerator(name: str, positional_only: bool = False, cpu_value: str | None = None) -> Neutral:
    return Neutral("{torch}.accelerator." + name, positional_only, cpu_value=cpu_value)


def _device_module(name: str, cpu_value: str | None = None) -> Neutral:
    return Neutral("{torch}.get_device_module()." + name, cpu_value=cpu_value)


#: torch.cuda calls that work without CUDA (lazy seeding, a cache with nothing in it,
#: zero statistics) -> their value there; checked on a CPU-only build (tests/lockin)
CPU_TOLERANT = {
    "empty_cache": "None", "memory_allocated": "0", "max_memory_allocated": "0", "memory_reserved": "0",
    "max_memory_reserved": "0", "memory_stats": "{}", "manual_seed": "None", "manual_seed_all": "None",
    "seed": "None", "seed_all": "None", "set_rng_state": "None", "set_rng_state_all": "None",
    "get_rng_state_all": "[]", "is_bf16_supported": "False", "is_initialized": "False",
}


#: ``torch.cuda.<name>`` (and ``torch.cuda.memory.<name>``) -> its neutral form
CUDA_API: dict[str, Neutral] = {
    "is_available": _accelerator("is_available"),
    "device_count": _accelerator("device_count"),
    "current_device": _accelerator("current_device_index"),
    "set_device": _accelerator("set_device_index", True),
    "device": _accelerator("device_index", True),
    "synchronize": _accelerator("synchronize", True),
    "current_stream": _accelerator("current_stream", True),
    "set_stream": _accelerator("set_stream", True),
    "empty_cache": _accelerator("empty_cache", cpu_value=CPU_TOLERANT["empty_cache"]),
    **{name: _accelerator(name, True, CPU_TOLERANT[name]) for name in (
        "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_stats")},
    "reset_peak_memory_stats": _accelerator("reset_peak_memory_stats", True),
    "reset_accumulated_memory_stats": _accelerator("reset_accumulated_memory_stats", True),
    "mem_get_info": _accelerator("get_memory_info", True),
    "Stream": Neutral("{torch}.Stream", max_positional=1),
    "Event": Neutral("{torch}.Event", max_positional=0),
    "OutOfMemoryError": Neutral("{torch}.OutOfMemoryError"),
    **{name: _device_module(name, CPU_TOLERANT.get(name)) for name in (
        "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state", "set_rng_state",
        "get_rng_state_all", "set_rng_state_all", "get_device_name", "get_device_properties",
        "get_device_capability", "is_bf16_supported", "stream", "StreamContext", "default_stream",
        "is_initialized", "init", "memory_snapshot", "is_current_stream_capturing")},
}

#: torch.cuda names that belong to a rule of their own
CUDA_GRAPH_NAMES = frozenset({"CUDAGraph", "graph", "graphs", "make_graphed_callables", "graph_pool_handle"})
CUDA_TENSOR_TYPES = frozenset({
    "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "ByteTensor", "CharTensor", "ShortTensor",
    "IntTensor", "LongTensor", "BoolTensor"})

#: what ``torch.cuda`` names with no neutral form are for, in the finding's message
CUDA_ONLY_HINTS = {
    "nvtx": "`torch.profiler.record_function(...)` marks ranges on any device",
    "jiterator": "write the kernel with torch operators or `torch.compile`",
    "comm": "`torch.distributed` collectives",
    "nccl": "`torch.distributed` collectives",
}

#: torch.cuda.amp names -> rewrite kind of the fixer
CUDA_AMP = {"autocast": "amp_autocast", "GradScaler": "amp_grad_scaler",
            "custom_fwd": "amp_custom_decorator", "custom_bwd": "amp_custom_decorator"}

#: Triton's decorators that make a kernel (TNL028)
TRITON_KERNEL_DECORATORS = frozenset({"triton.jit", "triton.autotune", "triton.heuristics"})

#: nn.DataParallel and its functional form (TNL026)
DATA_PARALLEL = frozenset({"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                           "torch.nn.parallel.data_parallel.DataParallel", "torch.nn.parallel.data_parallel",
                           "torch.nn.parallel.data_parallel.data_parallel"})

#: profilers whose ``use_cuda=`` profiles CUDA kernels (TNL023)
PROFILER_CALLS = frozenset({"torch.autograd.profiler.profile", "torch.autograd.profiler.emit_nvtx",
                            "torch.profiler.profile", "torch.autograd.profile"})
PROFILER_CUDA = frozenset({"torch.profiler.ProfilerActivity.CUDA", "torch.autograd.ProfilerActivity.CUDA",
                           "torch._C._profiler.ProfilerActivity.CUDA", "torch.autograd.DeviceType.CUDA"})

#: calls that tell whether there is a CUDA device (or an accelerator): code under them
#: has one, so a rewrite there needs no fallback for a machine without
AVAILABILITY_CALLS = frozenset({"torch.cuda.is_available", "torch.accelerator.is_available"})
DEVICE_COUNT_CALLS = frozenset({"torch.cuda.device_count", "torch.accelerator.device_count"})

#: packages that run only on NVIDIA GPUs (import roots)
CUDA_ONLY_PACKAGES = frozenset({
    "apex", "flash_attn", "flash_attn_interface", "xformers", "bitsandbytes", "triton", "pycuda", "cupy",
    "cupyx", "pynvml", "nvidia", "tensorrt", "torch_tensorrt", "transformer_engine", "mamba_ssm",
    "causal_conv1d", "liger_kernel", "cuda", "numba.cuda", "nvtx", "fused_dense_lib", "dropout_layer_norm",
    "flashinfer", "deep_gemm",
})

#: torch.compile modes that capture CUDA graphs under Inductor -> neutral mode (None: no automatic one)
CUDA_GRAPH_COMPILE_MODES = {"max-autotune": "max-autotune-no-cudagraphs", "reduce-overhead": None}

FLASH_ATTENTION_IMPLEMENTATIONS = frozenset({"flash_attention_2", "flash_attention_3"})

#: functions whose ``backend`` argument is a process-group backend
PROCESS_GROUP_CALLS = frozenset({"torch.distributed.init_process_group", "torch.distributed.new_group",
                                 "torch.distributed.distributed_c10d.init_process_group"})

#: ``torch.backends.cuda.matmul.allow_tf32 = <bool>`` -> the neutral precision setting
MATMUL_PRECISION = {True: "high", False: "highest"}

#: capability tests: code under them runs only where the named CUDA piece exists,
#: so its findings are guarded (reported, not counted)
CAPABILITY_GUARDS = frozenset({"torch.backends.cudnn.is_available", "torch.backends.cuda.is_built",
                               "torch.distributed.is_nccl_available"})

#: calls that take a device type first -> the positional index of their ``enabled``
AMP_DEVICE_CALLS = {"torch.autocast": 2, "torch.amp.autocast": 2, "torch.amp.autocast_mode.autocast": 2,
                    "torch.amp.GradScaler": 5, "torch.amp.grad_scaler.GradScaler": 5}
