"""model.cuda(device) with a torch.device object, and with an index."""
import torch

torch.manual_seed(0)
model = torch.nn.Linear(2, 2)
if torch.cuda.is_available():
    device = torch.device("cuda", 0)
    model = model.cuda(device)
    x = torch.ones(1, 2).cuda(0)
else:
    device = torch.device("cpu")
    x = torch.ones(1, 2)
print(round(model(x).sum().item(), 4), next(model.parameters()).device == x.device)
