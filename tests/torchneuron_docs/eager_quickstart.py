"""Eager mode, as TorchNeuron's first-model quickstart runs it: a model moved to `neuron`, a forward
pass, the device synchronised, the CPU fallbacks listed. Checked against the same model on the CPU."""
import copy

import torch
import torch.nn as nn
import torch_neuronx

torch.manual_seed(0)
device = torch.device("neuron")
model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 10))
reference = model
inputs = torch.randn(16, 64)

model_on_device = copy.deepcopy(model).to(device)
torch_neuronx.clear_op_tracking()
with torch.no_grad():
    logits = model_on_device(inputs.to(device))
torch_neuronx.synchronize()

print("device:", logits.device, "shape:", tuple(logits.shape))
print("ran on neuron:", sorted(set(torch_neuronx.get_executed_ops()))[:5], "...")
print("fell back to the CPU:", torch_neuronx.get_fallback_ops())
with torch.no_grad():
    assert torch.equal(logits.cpu(), reference(inputs)), "eager neuron runs the CPU's kernels: bit for bit"
assert torch_neuronx.device_count() >= 1 and torch_neuronx.current_device() == 0
print("OK eager quickstart")
