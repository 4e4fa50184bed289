"""Classify synthetic digits with a --no-cuda flag (pytorch/examples mnist, the older style)."""
import argparse
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.fc1 = nn.Linear(4 * 3 * 3, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        return F.log_softmax(self.fc1(torch.flatten(x, 1)), dim=1)


def main():
    parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
    parser.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--save-model", action="store_true", default=True)
    args = parser.parse_args([])
    use_cuda = not args.no_cuda and torch.cuda.is_available()  # ties: TNL004
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if use_cuda else "cpu")  # ties: TNL003
    train_kwargs = {"batch_size": 8}
    if use_cuda:
        cuda_kwargs = {"num_workers": 0, "pin_memory": True, "shuffle": True}
        train_kwargs.update(cuda_kwargs)
    images = torch.randn(32, 1, 8, 8)
    loader = DataLoader(TensorDataset(images, torch.arange(32) % 10), **train_kwargs)
    model = Net().to(device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    model.train()
    for data, target in loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
    print(f"loss {loss.item():.2f}")
    if args.save_model:
        torch.save(model.state_dict(), os.path.join(tempfile.mkdtemp(), "mnist_cnn.pt"))


if __name__ == "__main__":
    main()
