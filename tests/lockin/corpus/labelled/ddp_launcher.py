"""Data-parallel training, launched by torchrun; one process without it.

    torchrun --nproc_per_node=8 ddp_launcher.py --out runs/ddp
    python ddp_launcher.py --out runs/ddp          # a single process
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

os.environ["NCCL_ASYNC_ERROR_HANDLING"] = "1"  # ties: TNL011
os.environ.setdefault("NCCL_DEBUG", "WARN")  # ties: TNL011


def setup():
    """(rank, world size, local rank, device); a process group when torchrun started us."""
    distributed = int(os.environ.get("RANK", -1)) != -1
    if not distributed:
        return 0, 1, 0, torch.device("cuda:0"), False  # ties: TNL003
    dist.init_process_group(backend="nccl")  # ties: TNL010
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)  # ties: TNL004
    return rank, world, local_rank, torch.device(f"cuda:{local_rank}"), True  # ties: TNL003


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps-per-epoch", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default="runs/ddp")
    args = parser.parse_args()

    rank, world, local_rank, device, distributed = setup()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.GELU(), torch.nn.Linear(32, 1)).to(device)
    if distributed:
        model = DDP(model, device_ids=[local_rank], output_device=local_rank)
        dist.barrier(device_ids=[local_rank])  # ties-implicit: TNL025
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 10, generator=g)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True).sin())
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=64 // args.steps_per_epoch // world, sampler=sampler, pin_memory=True)

    losses = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for inputs, target in loader:
            inputs, target = inputs.to(device, non_blocking=True), target.to(device, non_blocking=True)
            loss = torch.nn.functional.mse_loss(model(inputs), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            reported = loss.detach()
            if distributed:
                dist.all_reduce(reported, op=dist.ReduceOp.AVG if dist.get_backend() == "nccl" else dist.ReduceOp.SUM)  # ties: TNL010
                reported /= 1 if dist.get_backend() == "nccl" else world  # ties: TNL010
            losses.append(reported.item())

    if rank == 0:
        module = model.module if distributed else model
        os.makedirs(args.out, exist_ok=True)
        torch.save({k: v.cpu() for k, v in module.state_dict().items()}, os.path.join(args.out, "model.pt"))
        with open(os.path.join(args.out, "result.json"), "w") as f:
            json.dump({"losses": losses}, f)
        print(f"world {world} of {torch.cuda.device_count()} devices, loss {losses[-1]:.5f}")  # ties: TNL004
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
