"""A device default in argparse: the CPU user passes --device cpu (here: when CUDA is absent)."""
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cuda")
args = parser.parse_args([] if torch.cuda.is_available() else ["--device", "cpu"])
torch.manual_seed(0)
w = torch.randn(4, 4).to(args.device)
print(round((w @ w).abs().sum().item(), 3))
