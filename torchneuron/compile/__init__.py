"""``torch.compile`` on ``neuron``: see docs/compile.md.

Importing this package registers:

* the Dynamo backend ``"neuron"`` (so ``backend="neuron"`` and
  ``torch.compiler.set_default_backend("neuron")`` work),
* the ``neuron`` device interface with Dynamo.

The ``neuron`` device is registered with Inductor (C++ kernels, a wrapper that
queues them as device tasks on the current stream) by :func:`register`, when
Inductor first asks ``torch.neuron`` for its code generators (its first
compilation, whatever the backend) or when the ``neuron`` backend compiles.
So ``torch.compile(model)`` with Inductor, the default backend, runs on
``neuron`` tensors too, and ``import torch`` does not import Inductor.
"""
from __future__ import annotations

import sys

import torch

from .. import neuron as _torch_neuron
from . import metrics, replay  # replay: mode="reduce-overhead" (imports no Inductor)
from .backend import MODES, NeuronCompileError, neuron_backend
from .registration import inductor_codegen, register, register_dynamo


def _register_backend() -> None:
    try:
        torch._dynamo.register_backend(compiler_fn=neuron_backend, name="neuron")
    except AssertionError as e:  # "duplicate name": registered by an earlier import of this package
        if "duplicate" not in str(e):
            raise


register_dynamo()
_register_backend()
# torch.neuron's answers that live here: Inductor's hook for a PrivateUse1 device (on its first
# compilation it asks for these two code generators), and TorchNeuron's Dynamo metrics
_torch_neuron.provide(("Scheduling", "PythonWrapperCodegen"), inductor_codegen)
_torch_neuron.provide(("get_dynamo_metrics", "reset_dynamo_metrics"), lambda name: getattr(metrics, name))
if "torch._inductor.codegen.common" in sys.modules:
    register()  # Inductor is loaded already (no autoload): its hook may have run before this import

__all__ = ["register", "neuron_backend", "NeuronCompileError", "MODES", "replay"]
