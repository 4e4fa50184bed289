"""4-bit fine-tuning set-up in QLoRA's style: GPU count and memory per GPU, a device map per local rank,
bfloat16 when the GPU has it; bitsandbytes optional here (a stand-in loader, no download)."""
import os

import torch
import torch.nn as nn

try:
    import bitsandbytes as bnb
except ImportError:
    bnb = None


def get_accelerate_model(bits=4, bf16=False, max_memory_MB=80000, full_finetune=False):
    n_gpus = torch.cuda.device_count()  # ties: TNL004
    max_memory = {i: f"{max_memory_MB}MB" for i in range(n_gpus)}
    device_map = "auto"
    if os.environ.get("LOCAL_RANK") is not None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device_map = {"": local_rank}
        max_memory = {"": max_memory[local_rank]}
    compute_dtype = torch.float16 if not bf16 else torch.bfloat16
    if compute_dtype == torch.float16 and bits == 4:
        if torch.cuda.is_bf16_supported():  # ties: TNL004
            print("=" * 80)
            print("Your GPU supports bfloat16, you can accelerate training with the argument --bf16")
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    if bnb is not None and not full_finetune:
        model = bnb.nn.Linear4bit(8, 4, compute_dtype=compute_dtype)
    return model, device_map, max_memory


model, device_map, max_memory = get_accelerate_model()
device = "cuda:0" if torch.cuda.is_available() else "cpu"  # ties: TNL003,TNL004
model = model.to(device)
out = model(torch.ones(2, 8, device=device))
torch.cuda.empty_cache()  # ties: TNL004
print(device_map, len(max_memory) >= 0, round(out.sum().item(), 4))
