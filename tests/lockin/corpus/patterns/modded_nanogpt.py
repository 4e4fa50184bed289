"""A speedrun-style GPT step (modded-nanogpt's style): an fp8 head through torch._scaled_mm, a Triton
kernel with a torch fallback, device fixed by LOCAL_RANK, memory and nvidia-smi reported."""
import os
import shutil
import subprocess

import torch
import torch.distributed as dist
import torch.nn as nn

try:
    import triton  # ties-implicit: TNL018
    import triton.language as tl  # ties-implicit: TNL018
except ImportError as e:
    raise RuntimeError("the fused kernels need Triton") from e


@triton.jit  # ties-implicit: TNL028
def relu_square_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, tl.maximum(x, 0) * tl.maximum(x, 0), mask=mask)


def relu_square(x):
    if x.device.type == "cuda":  # ties: TNL003
        out = torch.empty_like(x)
        relu_square_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)  # ties-implicit: TNL028
        return out
    return torch.relu(x).square()


def mm_fp8(x, w, x_s=1.0, w_s=1.0):
    x_f8 = x.div(x_s).to(torch.float8_e4m3fn)
    w_f8 = w.div(w_s).to(torch.float8_e4m3fn)
    return torch._scaled_mm(x_f8, w_f8.T, out_dtype=torch.bfloat16, scale_a=x.new_tensor(x_s, dtype=torch.float32),  # ties-implicit: TNL027
                            scale_b=x.new_tensor(w_s, dtype=torch.float32), use_fast_accum=True)


ddp = "RANK" in os.environ
local_rank = int(os.environ.get("LOCAL_RANK", 0))
device = torch.device("cuda", local_rank)  # ties: TNL003
torch.cuda.set_device(device)  # ties: TNL004
if ddp:
    dist.init_process_group(backend="nccl", device_id=device)  # ties: TNL010
    dist.barrier()
master_process = local_rank == 0


def print0(s):
    if master_process:
        print(s)


if shutil.which("nvidia-smi"):
    subprocess.run(["nvidia-smi"], stdout=subprocess.DEVNULL)
torch.manual_seed(0)
hidden = nn.Linear(16, 16, bias=False).to(device)
head = torch.randn(32, 16, device="cuda") * 0.1  # ties: TNL003
x = torch.randn(8, 16).cuda(non_blocking=True)  # ties: TNL001
h = relu_square(hidden(x))
logits = mm_fp8(h, head)
torch.cuda.synchronize()  # ties: TNL004
print0(f"logits {tuple(logits.shape)} {logits.dtype}")
print0(f"peak memory allocated: {torch.cuda.max_memory_allocated() // 1024 // 1024} MiB")  # ties: TNL004
