"""torch.compile with the `neuron` backend, as TorchNeuron's compile quickstart runs it: fullgraph,
a named model, the compilation metrics read back."""
import copy

import torch
import torch.nn as nn
import torch_neuronx
from torch_neuronx.neuron_dynamo_backend import set_model_name

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)).to("neuron")
set_model_name("quickstart_mlp")
compiled = torch.compile(model, backend="neuron", fullgraph=True)
x = torch.randn(8, 32, device="neuron")
with torch.no_grad():
    for _ in range(3):  # the first call compiles, the next ones reuse it
        y = compiled(x)
torch_neuronx.synchronize()

on_cpu = torch.compile(copy.deepcopy(model).cpu(), backend="inductor", fullgraph=True)
with torch.no_grad():
    assert torch.equal(y.cpu(), on_cpu(x.cpu())), "the same generated code as Inductor on the CPU"
metrics = torch_neuronx.get_dynamo_metrics()
for m in metrics:
    print(m.graph_name, m.graph_node_count, "nodes")
assert metrics and all(m.model_name == "quickstart_mlp" for m in metrics)
print("OK compile quickstart")
