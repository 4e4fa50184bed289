"""The inference API of AWS's ``torch_neuronx`` (trace, weights, analysis, data
parallelism, loading), as it maps onto this device.

AWS's ``torch_neuronx.trace`` records a function with torch-xla and compiles
it with neuronx-cc into one fused graph. Here there is no compiler between a
program and the device: operators run as device kernels. So :func:`trace`
records the function with ``torch.jit.trace`` on ``neuron`` and returns the
``ScriptModule`` (saved with ``torch.jit.save``, reloaded with
``torch.jit.load``), and the functions that tune NEFF loading have nothing to
tune. Differences from AWS's API are in each docstring.
"""
from __future__ import annotations

import copy
import io
import re
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils._pytree import tree_map

import torchneuron


def _target_device(cpu_backend: bool = False) -> torch.device:
    if cpu_backend:
        return torch.device("cpu")
    return torch.device("neuron", torch.neuron.current_device())


def _as_tuple(example_inputs) -> tuple:
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def _to(device: torch.device, value):
    return tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, value)


def _on_device(func, device: torch.device):
    """A module is copied to ``device`` (the caller's stays where it is); a
    plain function is used as it is."""
    if isinstance(func, torch.nn.Module):
        return _replicate(func, device)
    return func


def trace(func, example_inputs, *positional, input_output_aliases=None, compiler_workdir=None, compiler_args=None,
          partitioner_config=None, inline_weights_to_neff=True, cpu_backend=False) -> torch.jit.ScriptModule:
    """Records ``func`` run on ``example_inputs`` on ``neuron`` and returns a ``torch.jit.ScriptModule``.

    The result is TorchScript, which PyTorch 2.13 deprecates (for new code,
    ``torch.compile(model, backend="neuron")``); torch.jit's deprecation
    notice is not repeated for each call. A module is copied to the current
    ``neuron`` device first (the module passed in stays where it was); the
    example inputs are moved there. The
    result runs on that device and, like any module moved there, takes its
    inputs on it and returns its results on it (AWS's traced modules take and
    return CPU tensors): ``traced(x.to("neuron")).cpu()``. ``cpu_backend=True``
    traces on the CPU instead, as in AWS's API.

    There is no neuronx-cc here, so ``compiler_workdir`` and ``compiler_args``
    have no effect (a warning says so); weights are separate tensors whatever
    ``inline_weights_to_neff`` says, so :func:`replace_weights` always works.
    ``partitioner_config`` (moving unsupported operators to the CPU) and
    ``input_output_aliases`` (device-resident state tensors) raise
    ``NotImplementedError``: every operator runs on the device, and state kept
    in ``neuron`` tensors stays there between calls anyway.
    """
    if positional:
        raise TypeError("trace() takes func and example_inputs as its only positional arguments")
    if partitioner_config is not None:
        raise NotImplementedError(
            "torch_neuronx.trace(partitioner_config=...): every operator runs on the neuron device, so nothing "
            "is partitioned to the CPU; trace without partitioner_config")
    if input_output_aliases:
        raise NotImplementedError(
            "torch_neuronx.trace(input_output_aliases=...): keep state in neuron tensors (module buffers updated "
            "in place, or tensors passed in and returned), which stay on the device between calls")
    ignored = [name for name, value in (("compiler_workdir", compiler_workdir), ("compiler_args", compiler_args))
               if value is not None]
    if ignored:
        warnings.warn(f"torch_neuronx.trace: {', '.join(ignored)} has no effect: torchneuron runs operators as "
                      "device kernels, with no neuronx-cc compilation", UserWarning, stacklevel=2)
    del inline_weights_to_neff  # weights are always separate tensors here
    device = _target_device(cpu_backend)
    inputs = _to(device, _as_tuple(example_inputs))
    with warnings.catch_warnings():
        # torch.jit.trace's own notice that TorchScript is deprecated; the
        # docstring says what the result is
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.trace(_method)?` is deprecated",
                                category=DeprecationWarning)
        return torch.jit.trace(_on_device(func, device), inputs)


def replace_weights(neuron_model: torch.nn.Module, weights) -> None:
    """Replaces the weights of a traced model, in place, with those of ``weights``
    (a module with the same structure, or a state dict); the tensors are copied
    to the device the model's own tensors are on. Names must match exactly
    (``load_state_dict(strict=True)``): a missing or unexpected key raises."""
    state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
    if not isinstance(state, Mapping):
        raise TypeError(f"replace_weights: weights must be a module or a state dict, not {type(weights).__name__}")
    neuron_model.load_state_dict(state, strict=True)


def _op_counts_since(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {op: n - before.get(op, 0) for op, n in sorted(after.items()) if n > before.get(op, 0)}


_OPERATOR_IN_MESSAGE = re.compile(r"\b(aten::[A-Za-z0-9_.]+)")


def analyze(func, example_inputs, compiler_workdir=None, additional_ignored_ops=None, max_workers=4,
            is_hf_transformers=False, cleanup=False) -> dict[str, Any]:
    """Runs ``func`` once on ``neuron`` (without gradients) and reports the operators the device ran.

    AWS's ``analyze`` asks neuronx-cc whether it can compile each operator.
    Here an operator is supported if the device ran it; the report is a dict:

    * ``"supported_operators"``: ``{"aten": {name: count}}``, every operator the
      device ran during the call, by the device's own operator tracking
      (``torchneuron.get_executed_ops()``);
    * ``"fallback_operators"``: ``{"aten": {name: count}}``, those that ran by
      the synchronous fallback (still on the device, but the host waited;
      README, "Fallback policy");
    * ``"unsupported_operators"``: ``{"aten": [...]}``, empty when the call
      completed, else one entry ``{"operator": name or None, "error": message}``
      for the error that stopped it;
    * ``"support_percentage"`` (a string such as ``"100.00%"``) and
      ``"torch_neuronx_version"``.

    Operators in ``additional_ignored_ops`` are left out of the counts. The
    tracking counts what the whole process runs on the device while ``func``
    runs. ``compiler_workdir``, ``max_workers``, ``is_hf_transformers`` and
    ``cleanup`` concern the compiler and have no effect.
    """
    from . import __version__

    del compiler_workdir, max_workers, is_hf_transformers, cleanup
    ignored = set(additional_ignored_ops or ())
    device = _target_device()
    model = _on_device(func, device)
    inputs = _to(device, _as_tuple(example_inputs))
    executed_before, fallback_before = torchneuron.get_executed_ops(), torchneuron.get_fallback_ops()
    unsupported = []
    try:
        with torch.no_grad():
            model(*inputs)
        torch.neuron.synchronize(device)
    except Exception as error:  # the report says what stopped the call
        named = _OPERATOR_IN_MESSAGE.search(str(error))
        unsupported.append({"operator": named.group(1) if named else None,
                            "error": f"{type(error).__name__}: {error}"})
    supported = {op: n for op, n in _op_counts_since(executed_before, torchneuron.get_executed_ops()).items()
                 if op not in ignored}
    fallback = {op: n for op, n in _op_counts_since(fallback_before, torchneuron.get_fallback_ops()).items()
                if op not in ignored}
    total = len(supported) + len(unsupported)
    percentage = 100.0 * len(supported) / total if total else 100.0
    return {
        "torch_neuronx_version": __version__,
        "support_percentage": f"{percentage:.2f}%",
        "supported_operators": {"aten": supported},
        "fallback_operators": {"aten": fallback},
        "unsupported_operators": {"aten": unsupported},
    }


def _scatter(value, chunk: int, count: int, dim: int, device: torch.device):
    def pick(v):
        if isinstance(v, torch.Tensor):
            return torch.tensor_split(v, count, dim)[chunk].to(device)
        return v

    return tree_map(pick, value)


def _gather(outputs: list, dim: int, device: torch.device):
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat([o.to(device) for o in outputs], dim)
    if isinstance(first, Mapping):
        return type(first)(**{k: _gather([o[k] for o in outputs], dim, device) for k in first})
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # a named tuple
        return type(first)(*(_gather(list(parts), dim, device) for parts in zip(*outputs)))
    if isinstance(first, (tuple, list)):
        return type(first)(_gather(list(parts), dim, device) for parts in zip(*outputs))
    return first


def _replicate(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A copy of ``module`` on ``device``. A ScriptModule is saved and loaded
    there (``map_location``): a deep copy of one has non-leaf parameters."""
    if isinstance(module, torch.jit.ScriptModule):
        with warnings.catch_warnings():  # TorchScript's deprecation notice, as in trace()
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.(save|load)` is deprecated",
                                    category=DeprecationWarning)
            buffer = io.BytesIO()
            torch.jit.save(module, buffer)
            buffer.seek(0)
            return torch.jit.load(buffer, map_location=device)
    return copy.deepcopy(module).to(device)


class DataParallel(torch.nn.Module):
    """Replicates ``module`` on several ``neuron`` devices and splits each batch across them.

    As ``torch_neuronx.DataParallel``: ``device_ids`` defaults to every
    ``neuron`` device; each tensor argument is split along ``dim`` into one
    chunk per device (uneven splits are fine; a batch smaller than the device
    count uses fewer devices), each replica runs its chunk, and the results
    are concatenated along ``dim`` on the first device. The replicas' work is
    queued on their own devices, so they run at the same time. With dynamic
    batching disabled (``set_dynamic_batching=False`` or
    :meth:`disable_dynamic_batching`) the batch must split evenly across the
    devices (``ValueError`` otherwise), as AWS's fixed-shape replicas require.
    ``module`` may be an ``nn.Module`` or a traced ``ScriptModule``; it is
    copied, the original is left where it is.
    """

    def __init__(self, module: torch.nn.Module, device_ids=None, dim: int = 0, set_dynamic_batching: bool = True):
        super().__init__()
        if device_ids is None:
            device_ids = range(torch.neuron.device_count())
        ids = [torch.neuron.device(d).idx if not isinstance(d, int) else d for d in device_ids]
        if not ids:
            raise ValueError("DataParallel needs at least one neuron device")
        for i in ids:
            if not 0 <= i < torch.neuron.device_count():
                raise ValueError(f"DataParallel: neuron:{i} does not exist "
                                 f"({torch.neuron.device_count()} neuron devices)")
        self.device_ids = ids
        self.dim = dim
        self.dynamic_batching = set_dynamic_batching
        self.replicas = torch.nn.ModuleList(_replicate(module, torch.device("neuron", i)) for i in ids)

    @property
    def module(self) -> torch.nn.Module:
        """The replica on the first device."""
        return self.replicas[0]

    def disable_dynamic_batching(self) -> None:
        self.dynamic_batching = False

    def forward(self, *inputs, **kwargs):
        sizes = {v.shape[self.dim] for v in torch.utils._pytree.tree_leaves((inputs, kwargs))
                 if isinstance(v, torch.Tensor)}
        if len(sizes) > 1:
            raise ValueError(f"DataParallel: tensor arguments differ in size along dim {self.dim}: {sorted(sizes)}")
        batch = sizes.pop() if sizes else len(self.device_ids)
        count = min(batch, len(self.device_ids)) or 1
        if not self.dynamic_batching and batch % len(self.device_ids):
            raise ValueError(f"DataParallel with dynamic batching disabled: a batch of {batch} does not split "
                             f"evenly across {len(self.device_ids)} devices")
        outputs = []
        for chunk in range(count):
            device = torch.device("neuron", self.device_ids[chunk])
            args, kw = _scatter((inputs, kwargs), chunk, count, self.dim, device)
            outputs.append(self.replicas[chunk](*args, **kw))
        return _gather(outputs, self.dim, torch.device("neuron", self.device_ids[0]))


def dynamic_batch(neuron_script: torch.nn.Module) -> torch.nn.Module:
    """Returns ``neuron_script``: a traced graph here takes any batch size the
    traced function itself accepts, so there is nothing to enable."""
    return neuron_script


def _check_traced(trace, api: str) -> None:
    if not isinstance(trace, torch.jit.ScriptModule):
        raise TypeError(f"torch_neuronx.{api} takes a module returned by torch_neuronx.trace, "
                        f"not {type(trace).__name__}")


def lazy_load(trace, enable_lazy_load: bool = True) -> None:
    """Accepted for AWS's API; there is no NEFF to load: a traced module's
    weights are ordinary tensors already in device memory."""
    _check_traced(trace, "lazy_load")


def async_load(trace, enable_async_load: bool = True) -> None:
    """Accepted for AWS's API; copies to the device are queued on its stream,
    so loading is asynchronous already."""
    _check_traced(trace, "async_load")


def move_trace_to_device(trace, device_id: int) -> None:
    """Moves a traced module's weights to ``neuron:device_id``, in place.

    A graph that creates tensors (``torch.arange(n, device=x.device)``)
    records the device it was traced on; such a module is traced on the
    target device instead: ``with torch.neuron.device(i): torch_neuronx.trace(...)``.
    """
    _check_traced(trace, "move_trace_to_device")
    trace.to(torch.device("neuron", device_id))
