"""``torch.neuron``: the device module, mirroring ``torch.cuda``.

Device, stream and event semantics live in C++ (csrc/bridge/device_guard.cpp);
memory in the caching allocator (csrc/bridge/allocator.cpp); this module is the
Python face of both, mostly through ``torch.accelerator``.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from .. import _C, environment
from . import amp  # noqa: F401  (torch.neuron.amp, as torch.cuda's)

_initialized = False


# ---------------------------------------------------------------- device
def is_available() -> bool:
    return _C.device_count() > 0


def device_count() -> int:
    return _C.device_count()


def _lazy_init() -> None:
    """Initialises the runtime; raises for a bad configuration or a bad fork."""
    global _initialized
    if is_initialized():
        return
    _C._init()
    _initialized = True


init = _lazy_init


def is_initialized() -> bool:
    """Whether this process initialised the runtime: a child forked after its
    parent did has not (its devices are the parent's), as ``torch.cuda``."""
    return _initialized and not _is_in_bad_fork()


def _is_in_bad_fork() -> bool:
    return _C._is_in_bad_fork()


def _index(device: Any = None, optional: bool = True) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "neuron":
        raise ValueError(f"expected a neuron device, got {device}")
    return current_device() if device.index is None else device.index


def current_device() -> int:
    return torch.accelerator.current_device_index() if is_available() else 0


def set_device(device: Any) -> None:
    _lazy_init()
    torch.accelerator.set_device_index(_index(device))


class device:
    """Context manager that changes the current device."""

    def __init__(self, device: Any):
        self.idx = -1 if device is None else _index(device)
        self.prev = -1

    def __enter__(self):
        if self.idx >= 0:
            self.prev = current_device()
            set_device(self.idx)

    def __exit__(self, *exc):
        if self.idx >= 0:
            set_device(self.prev)
        return False


@dataclass(frozen=True)
class _DeviceProperties:
    name: str
    total_memory: int
    core_id: int
    major: int  # the NeuronCore generation (get_device_capability)
    minor: int
    # logical NeuronCores per Trainium device: the machine model's (TORCHNEURON_MACHINE)
    # physical cores over the LNC, as a Trainium2 device exposes 4 logical cores at LNC=2
    cores_per_device: int
    # physical NeuronCores this device (a logical core) groups: NEURON_LOGICAL_NC_CONFIG
    logical_nc_config: int = 1
    type: str = "neuron"


_GENERATION = re.compile(r"NeuronCore-v(\d+)\b")


def get_device_properties(device: Any = None) -> _DeviceProperties:
    """The properties of ``device`` (the current device if ``None``).

    As ``torch.cuda.get_device_properties``: a device of another type raises
    ``ValueError``, an index outside ``[0, device_count())`` ``AssertionError``.
    """
    _lazy_init()
    index = _index(device)
    if index < 0 or index >= device_count():
        raise AssertionError("Invalid device id")
    name, total, core, cores_per_device, lnc = _C._device_properties(index)
    generation = _GENERATION.match(name)
    if generation is None:
        raise RuntimeError(f"the device name {name!r} does not name a NeuronCore generation")
    return _DeviceProperties(name=name, total_memory=total, core_id=core, major=int(generation.group(1)), minor=0,
                             cores_per_device=cores_per_device, logical_nc_config=lnc)


def get_device_capability(device: Any = None) -> tuple[int, int]:
    """The ``(major, minor)`` capability of ``device`` (the current device if ``None``).

    ``major`` is the NeuronCore generation the device implements, the number in
    its name: 3 for NeuronCore-v3, the core of Trainium2 (2 is Trainium1's and
    Inferentia2's, 1 Inferentia1's). ``minor`` is 0: NeuronCore generations
    have no minor revisions. Arguments and errors are those of
    ``get_device_properties``, as for ``torch.cuda.get_device_capability``.
    """
    props = get_device_properties(device)
    return props.major, props.minor


def utilization(device: Any = None) -> int:
    """Percent of the past second during which one or more of the device's
    streams ran a task, as ``torch.cuda.utilization`` reports the percent of its
    sample period during which one or more kernels ran. Arguments and errors
    are those of ``get_device_properties``."""
    return _C._utilization(_index(device))


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


def synchronize(device: Any = None) -> None:
    _lazy_init()
    _C._synchronize(_index(device))


# ---------------------------------------------------------------- errors
# A device task that fails leaves its error on the device, as a CUDA kernel's
# sticky error does: every synchronising call on that device (synchronize,
# .cpu(), .item(), event waits, synchronous operators) raises the first
# failure, with the exception type its kernel threw, until reset_errors()
# clears them. Tensors written by the failed task, or computed from them,
# hold unspecified values.
def device_errors(device: Any = None) -> dict:
    """The device's kept errors, without clearing them: ``{"errors": [message,
    ...], "total": n, "unreported": n, "unreported_errors": [message, ...]}``;
    unreported ones failed after a synchronising call last raised."""
    _lazy_init()
    return _C._device_errors(_index(device))


def reset_errors(device: Any = None) -> list[str]:
    """Clears the device's errors and returns their messages, oldest first
    (the first 64; ``device_errors()["total"]`` counts all)."""
    _lazy_init()
    return list(_C._reset_errors(_index(device))["errors"])


# ---------------------------------------------------------------- streams and events
# torch.Stream and torch.Event check argument types exactly (elapsed_time,
# wait_event, ...), so these construct plain torch.Stream / torch.Event objects
# on the current neuron device rather than subclasses.
class Stream:
    """An in-order queue of device work: returns a ``torch.Stream`` on ``neuron``."""

    def __new__(cls, device: Any = None, priority: int = 0) -> torch.Stream:
        _lazy_init()
        index = _index(device)
        return torch.Stream(device=torch.device("neuron", index), priority=priority)


class Event:
    """A marker in a stream: returns a ``torch.Event`` on ``neuron``."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:
        _lazy_init()
        return torch.Event(device=torch.device("neuron", current_device()), enable_timing=enable_timing,
                           blocking=blocking, interprocess=interprocess)


def current_stream(device: Any = None) -> torch.Stream:
    _lazy_init()
    return torch.accelerator.current_stream(_index(device))


def default_stream(device: Any = None) -> torch.Stream:
    _lazy_init()
    s = torch.accelerator.current_stream(_index(device))
    return torch.Stream(stream_id=0, device_index=s.device_index, device_type=s.device_type)


def set_stream(stream: torch.Stream) -> None:
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """Context manager that makes ``stream`` current while its block runs.

    The stream becomes current on its own device, which becomes the current
    device; on exit the stream that was current there and the stream and
    device that were current before are restored, also when the block raises.
    ``None`` (or no available device) makes it a no-op. As
    ``torch.cuda.StreamContext``, the previous streams are read on entry.
    """

    def __init__(self, stream: torch.Stream | None):
        self.stream = stream
        self.idx = current_device() if is_available() else -1
        self.src_prev_stream: torch.Stream | None = None
        self.dst_prev_stream: torch.Stream | None = None

    def __enter__(self) -> None:
        target = self.stream
        if target is None or self.idx == -1:
            return
        self.src_prev_stream = current_stream(None)
        if self.src_prev_stream.device != target.device:
            self.dst_prev_stream = current_stream(target.device)
        set_stream(target)

    def __exit__(self, *exc: Any) -> None:
        target = self.stream
        if target is None or self.idx == -1:
            return
        if self.src_prev_stream.device != target.device:
            set_stream(self.dst_prev_stream)
        set_stream(self.src_prev_stream)


def stream(stream: torch.Stream | None) -> StreamContext:
    """Runs the block with ``stream`` current (on its device); ``None``: a no-op."""
    return StreamContext(stream)


# ---------------------------------------------------------------- memory
def memory_stats(device: Any = None) -> dict:
    return torch.accelerator.memory_stats(_index(device))


def memory_allocated(device: Any = None) -> int:
    return torch.accelerator.memory_allocated(_index(device))


def max_memory_allocated(device: Any = None) -> int:
    return torch.accelerator.max_memory_allocated(_index(device))


def memory_reserved(device: Any = None) -> int:
    return torch.accelerator.memory_reserved(_index(device))


def max_memory_reserved(device: Any = None) -> int:
    return torch.accelerator.max_memory_reserved(_index(device))


def reset_peak_memory_stats(device: Any = None) -> None:
    torch.accelerator.reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(_index(device))


def empty_cache() -> None:
    if _initialized:
        torch.accelerator.empty_cache()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    return torch.accelerator.get_memory_info(_index(device))


# torch.cuda's deprecated spellings, still called by libraries; each warns as
# torch.cuda's does and then does what its replacement does.
def reset_max_memory_allocated(device: Any = None) -> None:
    warnings.warn("torch.neuron.reset_max_memory_allocated now calls torch.neuron.reset_peak_memory_stats, "
                  "which resets /all/ peak memory stats.", FutureWarning, stacklevel=2)
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device: Any = None) -> None:
    warnings.warn("torch.neuron.reset_max_memory_cached now calls torch.neuron.reset_peak_memory_stats, "
                  "which resets /all/ peak memory stats.", FutureWarning, stacklevel=2)
    reset_peak_memory_stats(device)


def memory_cached(device: Any = None) -> int:
    warnings.warn("`torch.neuron.memory_cached` has been renamed to `torch.neuron.memory_reserved`",
                  FutureWarning, stacklevel=2)
    return memory_reserved(device)


def max_memory_cached(device: Any = None) -> int:
    warnings.warn("`torch.neuron.max_memory_cached` has been renamed to `torch.neuron.max_memory_reserved`",
                  FutureWarning, stacklevel=2)
    return max_memory_reserved(device)


# ---------------------------------------------------------------- random numbers
def default_generator(device: Any = None) -> torch.Generator:
    _lazy_init()
    return _C._default_generator(_index(device))


def manual_seed(seed: int) -> None:
    if is_available():
        default_generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        default_generator(i).manual_seed(int(seed))


def seed() -> None:
    if is_available():
        default_generator().seed()


def seed_all() -> None:
    for i in range(device_count()):
        default_generator(i).seed()


def initial_seed() -> int:
    return default_generator().initial_seed()


def get_rng_state(device: Any = "neuron") -> torch.Tensor:
    return default_generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "neuron") -> None:
    default_generator(device).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def _default_generators() -> tuple[torch.Generator, ...]:
    """``torch.neuron.default_generators``: one generator per device, as
    ``torch.cuda.default_generators`` (read as a module attribute; it
    initialises the runtime, as CUDA's generators need the driver)."""
    return tuple(default_generator(i) for i in range(device_count()))


# ---------------------------------------------------------------- mixed precision
def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float32, torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def is_current_stream_capturing() -> bool:
    """False: the device has no graph capture (``torch.cuda.graph``), so no
    stream is ever capturing."""
    return False




def _is_launch_blocking() -> bool:
    return environment.flag("NEURON_LAUNCH_BLOCKING")


# ---------------------------------------------------------------- attributes registered from above
# Names the subsystems built on this module answer (compile/ registers Inductor's code
# generators and the Dynamo metrics): name -> function of the name.
_PROVIDED: dict[str, Any] = {}


def provide(names, answer) -> None:
    """Makes ``torch.neuron.<name>`` for each of ``names`` answer ``answer(name)``, on each read."""
    for name in names:
        _PROVIDED[name] = answer


def __getattr__(name: str):
    # Inductor's hook for a PrivateUse1 device: on its first compilation it asks
    # torch.neuron for ``Scheduling`` and ``PythonWrapperCodegen``; the answer
    # registers neuron with Inductor (torchneuron/compile/registration.py).
    answer = _PROVIDED.get(name)
    if answer is not None:
        return answer(name)
    if name == "default_generators":
        return _default_generators()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
