"""An .is_cuda test deciding what to report."""
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(3, 2).to(device)
if next(model.parameters()).is_cuda:
    print("accelerator", torch.cuda.max_memory_allocated() >= 0)
else:
    print("host")
x = torch.ones(2)
print(x.is_cuda, x.to(device).is_cuda == torch.cuda.is_available())
