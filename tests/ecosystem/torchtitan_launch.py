"""Runs TorchTitan's trainer (what `python -m torchtitan.train ARGS` runs) under torchrun, with
the one workaround a run on `neuron` needs (docs/ecosystem.md, TorchTitan):

    torchrun --nproc-per-node=N tests/ecosystem/torchtitan_launch.py --module llama3 --config ... ARGS

- torchtitan 0.3.0 calls `torch.distributed.set_timeout` after the first step, an API newer
  than PyTorch 2.13. Here it is PyTorch 2.13's own `distributed_c10d._set_pg_timeout`, which
  does the same (a new timeout for a group's later collectives). This is not about `neuron`:
  any device needs it with this PyTorch.

With TORCHTITAN_REFERENCE_ON_CPU=1 (and TORCH_DEVICE_BACKEND_AUTOLOAD=0, so torchneuron is never
loaded) the same trainer runs on the CPU over gloo, as the tests' reference. TorchTitan has no CPU
mode: with no accelerator it picks "cuda". The reference therefore points TorchTitan's device
choice at the CPU and runs FlexAttention eagerly with PyTorch's refusal of its CPU backward lifted
(a check of the device type alone; the eager math is device-agnostic and is what `neuron` runs
eagerly), and has FSDP2 reduce with SUM where gloo refuses PREMUL_SUM. None of this is needed, or
done, on `neuron`.

With TORCHTITAN_EAGER_FLEX=1 (a test setting) FlexAttention runs uncompiled on `neuron` too, so
that the rest of TorchTitan's step can be compared with the CPU reference bit for bit.
"""
import contextlib
import os
import runpy
import sys
import types

import torch
import torch.distributed
from torch.distributed import distributed_c10d

# What the reference changes for the life of its process.
_FOR_THE_PROCESS = contextlib.ExitStack()


def cpu_device_module():
    """What TorchTitan asks of its device module (torch.cuda's names), answered for the CPU:
    one device, no memory statistics."""
    properties = types.SimpleNamespace(name="cpu", total_memory=1 << 40)
    return types.SimpleNamespace(
        set_device=lambda device: None, current_device=lambda: 0, device_count=lambda: 1,
        synchronize=lambda device=None: None, empty_cache=lambda: None,
        get_device_name=lambda device=None: "cpu", get_device_properties=lambda device=None: properties,
        memory_stats=lambda device=None: {}, reset_peak_memory_stats=lambda device=None: None)


def point_torchtitan_at_the_cpu():
    import torchtitan.components.metrics
    import torchtitan.distributed.parallel_dims
    import torchtitan.distributed.utils
    import torchtitan.models.common.token_dispatcher
    import torchtitan.tools.utils

    module = cpu_device_module()
    for m in (torchtitan.tools.utils, torchtitan.components.metrics, torchtitan.distributed.parallel_dims,
              torchtitan.distributed.utils, torchtitan.models.common.token_dispatcher):
        if hasattr(m, "device_type"):
            m.device_type = "cpu"
        if hasattr(m, "device_module"):
            m.device_module = module
    _FOR_THE_PROCESS.enter_context(cpu_flex_backward_allowed())
    run_flex_attention_eagerly()

    # TorchTitan turns FSDP2's gradient division off (a factor of 1.0: it scales by the global token
    # count itself), so FSDP2 reduce-scatters with ReduceOp.PREMUL_SUM(1.0), which gloo refuses. A
    # plain SUM, FSDP2's own alternative, gives the same values: the premultiplication is by 1.0.
    from torch.distributed.fsdp import FSDPModule

    set_gradient_divide_factor = FSDPModule.set_gradient_divide_factor

    def set_factor_and_sum_in_the_collectives(self, factor):
        set_gradient_divide_factor(self, factor)
        self.set_force_sum_reduction_for_comms(True)

    FSDPModule.set_gradient_divide_factor = set_factor_and_sum_in_the_collectives


@contextlib.contextmanager
def cpu_flex_backward_allowed():
    """PyTorch refuses FlexAttention on CPU tensors that need gradients, by device type alone; the
    eager math (what `neuron` runs eagerly) is device-agnostic. Other devices keep the checks.
    Used by the CPU reference here and by benchmarks/torchtitan_step.py."""
    import torch.nn.attention.flex_attention as flex

    checks = flex._validate_device

    def validate_without_the_cpu_backward_refusal(query, key, value):
        if query.device.type != "cpu":
            checks(query, key, value)

    flex._validate_device = validate_without_the_cpu_backward_refusal
    try:
        yield
    finally:
        flex._validate_device = checks


def run_flex_attention_eagerly():
    """TorchTitan compiles flex_attention once, as a class attribute; this runs it uncompiled."""
    import torch.nn.attention.flex_attention as flex

    from torchtitan.models.common.attention import FlexAttention

    FlexAttention._compiled_flex_attn = flex.flex_attention


if __name__ == "__main__":
    if not hasattr(torch.distributed, "set_timeout"):
        torch.distributed.set_timeout = distributed_c10d._set_pg_timeout
    if os.environ.get("TORCHTITAN_REFERENCE_ON_CPU") == "1":
        point_torchtitan_at_the_cpu()
    elif os.environ.get("TORCHTITAN_EAGER_FLEX") == "1":
        run_flex_attention_eagerly()
    sys.argv[0] = "torchtitan.train"
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
