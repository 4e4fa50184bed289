"""Token-by-token decoding with a device_sync helper and an optional compiled step (gpt-fast's
generate.py style); the checkpoint is memory-mapped without a map_location."""
import os
import tempfile
import time

import torch
import torch._inductor.config
import torch.nn as nn

torch._inductor.config.coordinate_descent_tuning = True
torch._inductor.config.triton.unique_kernel_names = True
default_device = "cuda" if torch.cuda.is_available() else "cpu"  # ties: TNL003,TNL004


def device_sync(device):
    if "cuda" in device:  # ties: TNL003
        torch.cuda.synchronize(device)  # ties: TNL004
    elif ("cpu" in device) or ("mps" in device):
        pass
    else:
        print(f"device={device} is not yet suppported")


def decode_one_token(model, x):
    return model(x)[:, -1].argmax(-1, keepdim=True)


def main(compile=False, profile=None, device=default_device):
    torch.manual_seed(1234)
    path = os.path.join(tempfile.mkdtemp(), "model.pth")
    torch.save(nn.Sequential(nn.Embedding(17, 8), nn.Linear(8, 17)).state_dict(), path)
    model = nn.Sequential(nn.Embedding(17, 8), nn.Linear(8, 17))
    checkpoint = torch.load(path, mmap=True, weights_only=True)  # ties-implicit: TNL024
    model.load_state_dict(checkpoint, assign=True)
    model = model.to(device=device, dtype=torch.float32)
    step = decode_one_token
    if compile:
        step = torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True)  # ties: TNL016
    x = torch.tensor([[1]], device=device)
    device_sync(device=device)
    t0 = time.perf_counter()
    if profile:
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]  # ties: TNL023
        with torch.profiler.profile(activities=activities) as prof:
            step(model, x)
        prof.export_chrome_trace(f"{profile}.json")
    for _ in range(4):
        x = torch.cat([x, step(model, x)], dim=1)
    device_sync(device=device)
    print(x.tolist(), time.perf_counter() - t0 >= 0)
    if "cuda" in device:  # ties: TNL003
        print(f"Memory used: {torch.cuda.max_memory_reserved() / 1e9:.02f} GB")  # ties: TNL004


if __name__ == "__main__":
    main()
