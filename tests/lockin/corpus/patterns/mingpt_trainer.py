"""A small trainer class choosing its device itself (minGPT's trainer style)."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, model, dataset, device="auto", batch_size=8, max_iters=3):
        if device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"  # ties: TNL003,TNL004
        else:
            self.device = device
        self.model = model.to(self.device)
        print("running on device", "accelerator" if self.device != "cpu" else "cpu")
        self.dataset, self.batch_size, self.max_iters = dataset, batch_size, max_iters

    def run(self):
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        loader = DataLoader(self.dataset, batch_size=self.batch_size, shuffle=False, pin_memory=True)
        losses = []
        for it, (x, y) in zip(range(self.max_iters), loader):
            x, y = x.to(self.device), y.to(self.device)
            loss = nn.functional.mse_loss(self.model(x), y)
            self.model.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(round(loss.item(), 3))
        return losses


torch.manual_seed(0)
xs = torch.randn(32, 4)
trainer = Trainer(nn.Linear(4, 1), TensorDataset(xs, xs.sum(1, keepdim=True)))
print(trainer.run())
