"""The DDP tutorial's toy model: one process per GPU when WORLD_SIZE says so, else one step locally."""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("nccl", rank=rank, world_size=world_size)  # ties: TNL010


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1, self.relu, self.net2 = nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank, world_size):
    setup(rank, world_size)
    model = ToyModel().to(rank)
    ddp_model = DDP(model, device_ids=[rank])
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    nn.MSELoss()(outputs, torch.randn(20, 5).to(rank)).backward()
    optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    n_gpus = torch.cuda.device_count()  # ties: TNL004
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if world_size > 1:
        assert n_gpus >= 2, f"Requires at least 2 GPUs to run, but got {n_gpus}"
        mp.spawn(demo_basic, args=(world_size,), nprocs=world_size, join=True)
    else:
        torch.manual_seed(0)
        model = ToyModel()
        print(round(model(torch.ones(2, 10)).sum().item(), 4), n_gpus >= 0)
