"""``torch_neuronx.neuron_dynamo_backend``: TorchNeuron's module of the ``neuron``
compile backend, answered by :mod:`torchneuron.compile`.

``neuron_backend`` is the backend ``torch.compile(backend="neuron")`` selects;
``create_neuron_backend()`` returns a backend callable of its own (for
``torch.compile(m, backend=create_neuron_backend())``), taking the ``options`` and
``mode`` keywords ``torch.compile`` passes. ``set_model_name`` names the graphs
compiled after it in the compilation metrics (``get_dynamo_metrics``).
"""
from __future__ import annotations

from torchneuron.compile import NeuronCompileError, neuron_backend
from torchneuron.compile.metrics import (  # noqa: F401
    NeuronCompilationMetrics,
    get_dynamo_metrics,
    get_model_name,
    reset_dynamo_metrics,
    set_model_name,
)

__all__ = ["neuron_backend", "create_neuron_backend", "set_model_name", "get_model_name",
           "NeuronCompileError", "NeuronCompilationMetrics", "get_dynamo_metrics", "reset_dynamo_metrics"]


def create_neuron_backend():
    """A backend callable for ``torch.compile(model, backend=create_neuron_backend())``."""

    def backend(gm, example_inputs, *, options=None, mode=None):
        return neuron_backend(gm, example_inputs, mode=mode, options=options)

    return backend
