"""Distributed training as TorchNeuron's distributed guide writes it, under torchrun: the `neuron`
process group, one device per rank (LOCAL_RANK), DDP, a side stream for a collective, checked
against the same steps on one process on the CPU.

    python -m torch.distributed.run --nproc-per-node=2 tests/torchneuron_docs/distributed_tutorial.py
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch_neuronx
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group(backend="neuron")
rank, world = dist.get_rank(), dist.get_world_size()
torch_neuronx.set_device(int(os.environ["LOCAL_RANK"]))
device = torch.device("neuron", torch_neuronx.current_device())


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


data = torch.Generator().manual_seed(1)
batches = [(torch.randn(8 * world, 16, generator=data), torch.randn(8 * world, 4, generator=data)) for _ in range(4)]
model = DDP(make_model().to(device))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in batches:
    share = slice(rank * 8, (rank + 1) * 8)
    loss = nn.functional.mse_loss(model(x[share].to(device)), y[share].to(device))
    loss.backward()
    opt.step()
    opt.zero_grad()

# a collective on a side stream, as the profiling guide's multi-rank example does
side = torch_neuronx.Stream(device)
total = torch.tensor([float(rank + 1)], device=device)
side.wait_stream(torch_neuronx.current_stream(device))
with torch_neuronx.stream(side):
    dist.all_reduce(total)
torch_neuronx.current_stream(device).wait_stream(side)
assert total.item() == world * (world + 1) / 2

reference = make_model()  # one process, the whole batch, on the CPU
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
for x, y in batches:
    nn.functional.mse_loss(reference(x), y).backward()
    ref_opt.step()
    ref_opt.zero_grad()
for p, q in zip(model.module.parameters(), reference.parameters()):
    torch.testing.assert_close(p.detach().cpu(), q, rtol=1e-5, atol=1e-6)  # averaging across ranks rounds
dist.destroy_process_group()
print(f"OK distributed tutorial rank {rank}")
