"""Dynamo's view of the ``neuron`` device (``torch._dynamo.device_interface``)."""
from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from typing import Any

import torch
from torch._dynamo.device_interface import DeviceInterface, caching_worker_current_devices, \
    caching_worker_device_properties

from .. import neuron as torch_neuron


@dataclass(frozen=True)
class NeuronDeviceProperties:
    """The device's properties plus what Inductor's heuristics read.
    ``multi_processor_count`` is the host's CPU count, as for Inductor's CPU
    device: the generated kernels are its C++ kernels, run by OpenMP threads."""
    name: str
    total_memory: int
    core_id: int
    multi_processor_count: int
    type: str = "neuron"


class NeuronInterface(DeviceInterface):
    device = None  # set below: torch.neuron.device

    Event = torch.Event
    Stream = torch.Stream

    class Worker:
        """Queries that must work in Inductor's compile workers: answers were
        recorded in the parent process, where the device is initialised."""

        @staticmethod
        def set_device(device: int) -> None:
            caching_worker_current_devices["neuron"] = device

        @staticmethod
        def current_device() -> int:
            if "neuron" in caching_worker_current_devices:
                return caching_worker_current_devices["neuron"]
            return torch_neuron.current_device()

        @staticmethod
        def get_device_properties(device: torch.types.Device = None) -> Any:
            if device is not None:
                if isinstance(device, str):
                    device = torch.device(device)
                index = device if isinstance(device, int) else device.index
            else:
                index = NeuronInterface.Worker.current_device()
            if index is None:
                index = NeuronInterface.Worker.current_device()
            if "neuron" not in caching_worker_device_properties:
                dev = torch_neuron
                props = [dev.get_device_properties(i) for i in range(dev.device_count())]
                caching_worker_device_properties["neuron"] = [
                    NeuronDeviceProperties(p.name, p.total_memory, p.core_id, multiprocessing.cpu_count())
                    for p in props]
            return caching_worker_device_properties["neuron"][index]

    @staticmethod
    def current_device() -> int:
        return torch_neuron.current_device()

    @staticmethod
    def set_device(device: torch.types.Device) -> None:
        torch_neuron.set_device(device)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        return NeuronInterface.exchange_device(device)

    @staticmethod
    def exchange_device(device: int) -> int:
        dev = torch_neuron
        prev = dev.current_device()
        if device >= 0 and device != prev:
            dev.set_device(device)
        return prev

    @staticmethod
    def device_count() -> int:
        return torch_neuron.device_count()

    @staticmethod
    def is_available() -> bool:
        return torch_neuron.is_available()

    @staticmethod
    def stream(stream: torch.Stream) -> Any:
        return torch_neuron.stream(stream)

    @staticmethod
    def current_stream() -> torch.Stream:
        return torch_neuron.current_stream()

    @staticmethod
    def set_stream(stream: torch.Stream) -> None:
        torch_neuron.set_stream(stream)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        torch_neuron.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type))

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        # Generated C++ kernels take no stream: launch.py queues them on the
        # current stream when the wrapper runs.
        return 0

    @staticmethod
    def synchronize(device: torch.types.Device = None) -> None:
        torch_neuron.synchronize(device)

    @staticmethod
    def get_compute_capability(device: torch.types.Device = None) -> str:
        return ""

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True

    @staticmethod
    def memory_allocated(device: torch.types.Device = None) -> int:
        return torch_neuron.memory_allocated(device)

    @staticmethod
    def is_triton_capable(device: torch.types.Device = None) -> bool:
        return False


def register() -> None:
    from torch._dynamo.device_interface import register_interface_for_device

    NeuronInterface.device = torch_neuron.device
    register_interface_for_device("neuron", NeuronInterface)
    for i in range(torch_neuron.device_count()):
        register_interface_for_device(f"neuron:{i}", NeuronInterface)
