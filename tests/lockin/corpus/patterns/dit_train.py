"""A diffusion transformer's training set-up (DiT's train.py style): one process per GPU under torchrun,
rank and device from the process group; here one local process when torchrun did not start it."""
import os
from copy import deepcopy

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

torch.backends.cuda.matmul.allow_tf32 = True  # ties: TNL008
torch.backends.cudnn.allow_tf32 = True  # ties: TNL007


@torch.no_grad()
def update_ema(ema_model, model, decay=0.9999):
    for ema_p, p in zip(ema_model.parameters(), model.parameters()):
        ema_p.mul_(decay).add_(p.data, alpha=1 - decay)


def main():
    distributed = "RANK" in os.environ
    if distributed:
        assert torch.cuda.is_available(), "Training currently requires at least one GPU."  # ties: TNL004
        dist.init_process_group("nccl")  # ties: TNL010
        rank = dist.get_rank()
        device = rank % torch.cuda.device_count()  # ties: TNL004
        torch.cuda.set_device(device)  # ties: TNL004
    else:
        rank, device = 0, "cuda" if torch.cuda.is_available() else "cpu"  # ties: TNL003,TNL004
    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(8, 16), nn.SiLU(), nn.Linear(16, 8))
    ema = deepcopy(model).to(device)
    for p in ema.parameters():
        p.requires_grad_(False)
    model = DDP(model.to(device), device_ids=[rank]) if distributed else model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)
    x = torch.randn(4, 8, device=device)
    for _ in range(2):
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        update_ema(ema, model.module if distributed else model)
    print(f"loss {loss.item():.4f}")
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
