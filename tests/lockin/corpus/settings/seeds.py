"""Seeds and cache calls that torch.cuda takes silently on a machine without CUDA."""
import torch

torch.manual_seed(1)
torch.cuda.manual_seed_all(1)
torch.cuda.manual_seed(1)
torch.cuda.empty_cache()
print(torch.cuda.memory_allocated() >= 0, torch.cuda.max_memory_reserved() >= 0)
print(torch.randn(3).tolist())
