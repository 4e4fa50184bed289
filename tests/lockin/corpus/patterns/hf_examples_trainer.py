"""A fine-tuning script in the style of the transformers examples: set_seed, n_gpu and DataParallel,
a device map and an attention implementation passed to a model loader (a stand-in here: no download)."""
import random

import torch
import torch.nn as nn

try:
    import flash_attn  # noqa: F401
    flash_available = True
except ImportError:
    flash_available = False


def set_seed(seed):
    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():  # ties: TNL004
        torch.cuda.manual_seed_all(seed)  # ties: TNL004


def from_pretrained(name, torch_dtype=torch.float32, device_map=None, attn_implementation="eager"):
    torch.manual_seed(len(name))
    return nn.Linear(6, 2).to(torch_dtype)


set_seed(42)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # ties: TNL003,TNL004
n_gpu = torch.cuda.device_count()  # ties: TNL004
bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()  # ties: TNL004
model = from_pretrained("tiny-model", torch_dtype=torch.float32,
                        device_map={"": 0} if torch.cuda.is_available() else None,  # ties: TNL004,TNL015
                        attn_implementation="flash_attention_2" if flash_available else "sdpa")  # ties: TNL019
model.to(device)
if n_gpu > 1:
    model = torch.nn.DataParallel(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
batch = torch.randn(4, 6).to(device)
for step in range(3):
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = model(batch).float().pow(2).mean()
    if n_gpu > 1:
        loss = loss.mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print(f"loss {loss.item():.4f}, n_gpu>0 {n_gpu > 0}")
if torch.cuda.is_available():  # ties: TNL004
    torch.cuda.empty_cache()  # ties: TNL004
