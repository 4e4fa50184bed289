"""Lightning (``lightning.pytorch``) on ``neuron``: an accelerator and two
strategies, registered in Lightning's own registries when this module is
imported (docs/lightning.md lists what Lightning 2.6 lacks and the workaround
of each gap).

    import torchneuron.lightning          # registers "neuron", "single_neuron", "ddp_neuron"

    Trainer(accelerator="neuron", strategy="single_neuron", precision="bf16-mixed")
    Trainer(accelerator="neuron", devices=2, strategy="ddp_neuron")   # DDP over the backend "neuron"

Lightning has no entry point through which a package adds an accelerator (its
``*.callbacks_factory`` entry points are read after the accelerator is chosen),
so the one import is needed. Importing this module imports ``lightning``.
"""
from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.accelerators import Accelerator, AcceleratorRegistry
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, StrategyRegistry
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_info


def _device_count() -> int:
    neuron = getattr(torch, "neuron", None)
    return neuron.device_count() if neuron is not None and neuron.is_available() else 0


def _parse_devices(devices: Any) -> list[int]:
    """``Trainer(devices=...)`` as the indices of ``neuron`` devices: ``N`` (the
    first N), ``-1`` (all), ``[i, j]``, or the strings ``"N"``, ``"-1"``, ``"i,j"``."""
    count = _device_count()
    given = devices
    if isinstance(devices, str):
        text = devices.strip()
        if "," in text or text.startswith("["):
            try:
                devices = [int(part) for part in text.strip("[]").split(",") if part.strip()]
            except ValueError:
                raise MisconfigurationException(f"Trainer(devices={given!r}): not a number or a list of device indices")
        else:
            try:
                devices = int(text)
            except ValueError:
                raise MisconfigurationException(f"Trainer(devices={given!r}): not a number or a list of device indices")
    if isinstance(devices, bool) or not isinstance(devices, (int, list, tuple)):
        raise MisconfigurationException(
            f"Trainer(devices={given!r}): expected an int, a list of device indices or a string of them")
    if isinstance(devices, int):
        if devices == -1:
            devices = count
        if devices < 1:
            raise MisconfigurationException(f"Trainer(devices={given!r}): ask for at least one neuron device, or -1 for all")
        if devices > count:
            raise MisconfigurationException(
                f"Trainer(devices={given!r}) asks for {devices} neuron devices, but there are {count} "
                "(NEURON_RT_VISIBLE_CORES / NEURON_RT_NUM_CORES set how many the runtime has)")
        return list(range(devices))
    indices = list(devices)
    if not indices:
        raise MisconfigurationException(f"Trainer(devices={given!r}): the list of devices is empty")
    for index in indices:
        if isinstance(index, bool) or not isinstance(index, int):
            raise MisconfigurationException(f"Trainer(devices={given!r}): device indices must be ints, got {index!r}")
        if not 0 <= index < count:
            raise MisconfigurationException(
                f"Trainer(devices={given!r}) names neuron:{index}, but there are {count} neuron devices "
                f"(indices 0 to {count - 1})")
    if len(set(indices)) != len(indices):
        raise MisconfigurationException(f"Trainer(devices={given!r}) names a device more than once")
    return indices


def _precision_on_neuron(plugin: Precision) -> Precision:
    """Lightning's connector builds ``MixedPrecision(precision, "cuda")`` for any
    accelerator other than the CPU and MPS, so bf16-mixed and 16-mixed would
    autocast on CUDA (absent: a warning, then float32). The same plugin on
    ``neuron``; a 16-mixed plugin gets a GradScaler of ``neuron``."""
    if type(plugin) is not MixedPrecision or plugin.device == "neuron":
        return plugin
    scaler = None
    if plugin.precision == "16-mixed":
        scaler = plugin.scaler if getattr(plugin.scaler, "_device", None) == "neuron" else torch.amp.GradScaler("neuron")
    rank_zero_info(f"MixedPrecision({plugin.precision!r}) autocasts on neuron (it was made for {plugin.device!r})")
    return MixedPrecision(plugin.precision, "neuron", scaler)


class NeuronAccelerator(Accelerator):
    """The ``neuron`` devices: ``Trainer(accelerator="neuron")``.

    Lightning 2.6 gives an accelerator it does not know no strategy of its own
    (one device: ``SingleDeviceStrategy("cpu")``; several: a ``DDPStrategy``
    that needs CUDA), so pass ``strategy="single_neuron"`` or
    ``strategy="ddp_neuron"``; without them this accelerator stops the run
    with an error saying so, rather than training on the CPU.
    """

    def setup_device(self, device: torch.device) -> None:
        if device.type != "neuron":
            raise MisconfigurationException(
                f"Trainer(accelerator='neuron') was given a strategy on {device}: Lightning 2.6 gives an accelerator "
                "it does not know SingleDeviceStrategy('cpu') for one device. Pass strategy='single_neuron' "
                "(or strategy=torchneuron.lightning.SingleNeuronStrategy('neuron:<i>')); for several devices, "
                "strategy='ddp_neuron'")
        torch.neuron.set_device(device)

    def setup(self, trainer) -> None:
        strategy = trainer.strategy
        # Lightning's DDPStrategy wraps the model under torch.cuda.stream(torch.cuda.Stream()) whenever it
        # has device ids, which raises without CUDA: say which strategy to use instead
        if isinstance(strategy, DDPStrategy) and not isinstance(strategy, NeuronDDPStrategy) \
                and strategy.determine_ddp_device_ids() is not None:
            raise MisconfigurationException(
                f"Trainer(accelerator='neuron') with Lightning's {type(strategy).__name__}: it wraps the model in a "
                "CUDA stream, which this machine does not have. Pass strategy='ddp_neuron' "
                "(or strategy=torchneuron.lightning.NeuronDDPStrategy(...), which takes DDPStrategy's arguments)")
        strategy.precision_plugin = _precision_on_neuron(strategy.precision_plugin)

    def teardown(self) -> None:
        pass

    @staticmethod
    def parse_devices(devices: Any) -> list[int]:
        return _parse_devices(devices)

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        return [torch.device("neuron", index) for index in _parse_devices(devices)]

    @staticmethod
    def auto_device_count() -> int:
        return _device_count()

    @staticmethod
    def is_available() -> bool:
        return _device_count() > 0

    @staticmethod
    def name() -> str:
        return "neuron"

    def get_device_stats(self, device) -> dict[str, Any]:
        return torch.neuron.memory_stats(device)

    @classmethod
    def register_accelerators(cls, accelerator_registry) -> None:
        accelerator_registry.register(cls.name(), cls, description="torchneuron's neuron devices")


class SingleNeuronStrategy(SingleDeviceStrategy):
    """One ``neuron`` device: ``strategy="single_neuron"`` (with
    ``accelerator="neuron"``), or ``SingleNeuronStrategy("neuron:1")``.

    Without a device it takes the first device ``Trainer(devices=...)`` names
    (``devices=[1]``: ``neuron:1``; the default: ``neuron:0``), as Lightning's
    own single-device XLA strategy does. Mixed precision autocasts on
    ``neuron``.
    """

    strategy_name = "single_neuron"

    def __init__(self, device: Any = None, accelerator=None, checkpoint_io=None, precision_plugin=None):
        self._device_given = device is not None
        device = torch.device(device) if device is not None else torch.device("neuron", 0)
        if device.type != "neuron":
            raise MisconfigurationException(f"SingleNeuronStrategy({str(device)!r}): the device must be a neuron device")
        if device.index is None:
            device = torch.device("neuron", torch.neuron.current_device())
        super().__init__(device=device, accelerator=accelerator, checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin)

    # Lightning's connector hands the accelerator's devices to a strategy that has this attribute and none yet
    @property
    def parallel_devices(self) -> list[torch.device] | None:
        return [self.root_device] if self._device_given else None

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device] | None) -> None:
        if devices:
            self._root_device = torch.device(devices[0])
            self._device_given = True

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(cls.strategy_name, cls, description="one neuron device")


class NeuronDDPStrategy(DDPStrategy):
    """DistributedDataParallel over ``neuron`` devices, one process each, with
    the ``torch.distributed`` backend ``neuron``: ``strategy="ddp_neuron"``
    (Lightning starts the other ranks by running the script again, as with
    ``"ddp"``), or ``NeuronDDPStrategy(...)`` with DDPStrategy's arguments.

    Lightning's DDPStrategy wraps the model under a CUDA stream when it has
    device ids; this one passes none (the module lives on one device, which
    DDP then finds by itself) and so needs no CUDA.
    """

    def determine_ddp_device_ids(self) -> list[int] | None:
        return None

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register("ddp_neuron", cls, description="DDP over neuron devices", start_method="popen")


def register() -> None:
    """Adds ``"neuron"`` to Lightning's accelerators and ``"single_neuron"`` and
    ``"ddp_neuron"`` to its strategies (done at import; again is a no-op)."""
    if NeuronAccelerator.name() not in AcceleratorRegistry:
        NeuronAccelerator.register_accelerators(AcceleratorRegistry)
    if SingleNeuronStrategy.strategy_name not in StrategyRegistry:
        SingleNeuronStrategy.register_strategies(StrategyRegistry)
    if "ddp_neuron" not in StrategyRegistry:
        NeuronDDPStrategy.register_strategies(StrategyRegistry)


register()

__all__ = ["NeuronAccelerator", "SingleNeuronStrategy", "NeuronDDPStrategy", "register"]
