"""A comparison of a device's type with "cuda"."""
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.ones(2)
print(x.device.type == "cuda", x.to(device).device.type == "cuda")
