"""A training script written against torch.accelerator: it names no vendor.

    python train_any_device.py --epochs 2          # on the current accelerator, or the CPU
    python train_any_device.py --cpu               # the CPU, whatever is installed
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def pick_device(force_cpu: bool) -> torch.device:
    """The current accelerator (CUDA, ROCm, XPU, MPS, neuron, ...) or the CPU."""
    if force_cpu or not torch.accelerator.is_available():
        return torch.device("cpu")
    return torch.accelerator.current_accelerator()


def main():
    parser = argparse.ArgumentParser(description="Train on whatever accelerator is there (CUDA included).")
    parser.add_argument("--cpu", action="store_true", help="ignore accelerators, e.g. a CUDA GPU")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()

    device = pick_device(args.cpu)
    torch.manual_seed(0)
    if device.type != "cpu":
        torch.get_device_module(device).manual_seed_all(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(device)
    if args.compile:
        model = torch.compile(model, mode="default")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device.type, enabled=device.type != "cpu")
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=16, pin_memory=device.type != "cpu")

    start, end = torch.Event(enable_timing=True), torch.Event(enable_timing=True)
    for epoch in range(args.epochs):
        start.record()
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        end.record()
        torch.accelerator.synchronize()
        print(f"epoch {epoch}: {loss.item():.4f} in {start.elapsed_time(end):.1f} ms")
    if device.type != "cpu":
        print(f"peak {torch.accelerator.max_memory_allocated() / 2**20:.1f} MiB")
        torch.accelerator.empty_cache()

    if "RANK" in os.environ:
        dist.init_process_group()
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
