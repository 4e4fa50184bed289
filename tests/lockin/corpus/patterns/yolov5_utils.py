"""Device selection, seeding, the zero-first barrier and an AMP step in yolov5's torch_utils style."""
import os
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn as nn

LOCAL_RANK = int(os.getenv("LOCAL_RANK", -1))
RANK = int(os.getenv("RANK", -1))


@contextmanager
def torch_distributed_zero_first(local_rank: int):
    if local_rank not in [-1, 0]:
        dist.barrier(device_ids=[local_rank])  # ties-implicit: TNL025
    yield
    if local_rank == 0:
        dist.barrier(device_ids=[0])  # ties-implicit: TNL025


def select_device(device="", batch_size=0):
    s = f"torch-{torch.__version__} "
    device = str(device).strip().lower().replace("cuda:", "").replace("none", "")  # ties: TNL003
    cpu = device == "cpu"
    if cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"  # ties: TNL012
    elif device:
        os.environ["CUDA_VISIBLE_DEVICES"] = device  # ties: TNL012
        assert torch.cuda.is_available(), f"Invalid CUDA '--device {device}' requested"  # ties: TNL004
    if not cpu and torch.cuda.is_available():  # ties: TNL004
        devices = device.split(",") if device else "0"
        for i, d in enumerate(devices):
            p = torch.cuda.get_device_properties(i)  # ties: TNL004
            s += f"CUDA:{d} ({p.name}, {p.total_memory / (1 << 20):.0f}MiB)\n"
        arg = "cuda:0"  # ties: TNL003
    else:
        s += "CPU\n"
        arg = "cpu"
    return torch.device(arg)


def init_seeds(seed=0, deterministic=False):
    torch.manual_seed(seed)
    torch.cuda.manual_seed(seed)  # ties: TNL004
    torch.cuda.manual_seed_all(seed)  # ties: TNL004
    if deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True  # ties: TNL007
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # ties: TNL013


init_seeds(0)
device = select_device("")
cuda = device.type != "cpu"
model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.SiLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()).to(device)
if cuda and RANK == -1 and torch.cuda.device_count() > 1:  # ties: TNL004
    model = torch.nn.DataParallel(model)
amp = cuda
scaler = torch.cuda.amp.GradScaler(enabled=amp)  # ties: TNL006
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
with torch_distributed_zero_first(LOCAL_RANK):
    imgs = torch.randn(2, 3, 8, 8)
for _ in range(2):
    with torch.cuda.amp.autocast(amp):  # ties: TNL006
        loss = model(imgs.to(device, non_blocking=True).float()).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
mem = f"{torch.cuda.memory_reserved() / 1E9 if torch.cuda.is_available() else 0:.3g}G"  # ties: TNL004
print(f"loss {loss.item():.4f} mem {mem}")
