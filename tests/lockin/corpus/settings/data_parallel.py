"""A device-count check guarding nn.DataParallel."""
import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Linear(4, 2).to(device)
if torch.cuda.device_count() > 1:
    model = nn.DataParallel(model)
out = model(torch.ones(6, 4).to(device))
print(tuple(out.shape), round(out.sum().item(), 4))
