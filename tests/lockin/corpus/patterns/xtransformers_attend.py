"""Attention choosing its kernels by GPU (x-transformers' Attend style): flash on A100s, math elsewhere."""
import os
from collections import namedtuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.amp import autocast

if os.environ.get("ATTEND_FLASH_ATTN") == "1":
    from flash_attn import flash_attn_func  # ties-implicit: TNL018

Config = namedtuple("Config", ["enable_flash", "enable_math", "enable_mem_efficient"])


class Attend(nn.Module):
    def __init__(self, flash=True):
        super().__init__()
        self.flash = flash
        self.cpu_config = Config(True, True, True)
        self.cuda_config = None
        if not torch.cuda.is_available() or not flash:  # ties: TNL004
            return
        device_properties = torch.cuda.get_device_properties(torch.device("cuda"))  # ties: TNL004,TNL003
        if device_properties.major == 8 and device_properties.minor == 0:
            self.cuda_config = Config(True, False, False)
        else:
            self.cuda_config = Config(False, True, True)

    def flash_attn(self, q, k, v):
        is_cuda = q.is_cuda  # ties: TNL002
        config = self.cuda_config if is_cuda else self.cpu_config
        with torch.backends.cuda.sdp_kernel(**config._asdict()):  # ties: TNL008
            return F.scaled_dot_product_attention(q, k, v)

    @autocast("cuda", enabled=False)  # ties: TNL003
    def forward(self, q, k, v):
        if self.flash:
            return self.flash_attn(q, k, v)
        scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
        return scores.softmax(dim=-1) @ v


torch.manual_seed(0)
q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
out = Attend()(q, k, v)
print(tuple(out.shape), round(out.sum().item(), 3))
