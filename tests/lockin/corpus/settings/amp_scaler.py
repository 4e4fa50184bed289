"""GradScaler and autocast from torch.cuda.amp, and torch.autocast("cuda"): disabled without CUDA."""
import torch

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(8, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.cuda.amp.GradScaler()
data = torch.randn(16, 8).to(device)
for step in range(3):
    opt.zero_grad()
    with torch.cuda.amp.autocast():
        loss = model(data).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
with torch.autocast("cuda", dtype=torch.bfloat16):
    y = model(data)
print(scaler.is_enabled(), y.dtype, round(loss.item(), 2))
