"""A torchrun launcher that lets PyTorch pick the communication backend of the device."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def setup() -> torch.device:
    dist.init_process_group()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.accelerator.is_available():
        torch.accelerator.set_device_index(local_rank)
        return torch.device(torch.accelerator.current_accelerator().type, local_rank)
    return torch.device("cpu")


def wrap(model: torch.nn.Module, device: torch.device) -> DistributedDataParallel:
    return DistributedDataParallel(model.to(device))


def average(t: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t / dist.get_world_size()


def stream_copy(x: torch.Tensor) -> torch.Tensor:
    side = torch.Stream()
    with side:
        y = x * 2
    torch.accelerator.current_stream().wait_stream(side)
    return y
