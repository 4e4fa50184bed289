"""A character-level GPT's training loop, configured by globals (nanoGPT's train.py style)."""
import math
import os
from contextlib import nullcontext

import torch
import torch.nn as nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

batch_size, block_size, n_embd, max_iters, learning_rate = 4, 8, 16, 3, 1e-2
backend = "nccl"  # ties: TNL010
device = "cuda"  # ties: TNL003
dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"  # ties: TNL004
compile = False

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend=backend)
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    device = f"cuda:{ddp_local_rank}"  # ties: TNL003
    torch.cuda.set_device(device)  # ties: TNL004
torch.manual_seed(1337)
torch.backends.cuda.matmul.allow_tf32 = True  # ties: TNL008
torch.backends.cudnn.allow_tf32 = True  # ties: TNL007
device_type = "cuda" if "cuda" in device else "cpu"  # ties: TNL003
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

data = torch.arange(200) % 13


def get_batch():
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    if device_type == "cuda":  # ties: TNL003
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y


model = nn.Sequential(nn.Embedding(13, n_embd), nn.Linear(n_embd, 13)).to(device)
scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))  # ties: TNL006
use_fused = device_type == "cuda"  # ties: TNL003
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, fused=use_fused)
if compile:
    model = torch.compile(model)
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank])

for it in range(max_iters):
    lr = learning_rate * 0.5 * (1 + math.cos(math.pi * it / max_iters))
    for group in optimizer.param_groups:
        group["lr"] = lr
    X, Y = get_batch()
    with ctx:
        logits = model(X)
        loss = nn.functional.cross_entropy(logits.view(-1, 13).float(), Y.view(-1))
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
print(f"iter {it}: loss {loss.item():.3f}")
if ddp:
    destroy_process_group()
