"""Train a small convolutional classifier on synthetic images: the classic CUDA script.

    python classic_train.py --epochs 2 --out runs/classic
"""
import argparse
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")  # ties: TNL012


class Net(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 2 * 2, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


def synthetic_data(n, generator):
    images = torch.randn(n, 1, 8, 8, generator=generator)
    labels = (images.mean(dim=(1, 2, 3)) > 0).long() + 2 * (images[:, 0, 0, 0] > 0).long()
    return TensorDataset(images, labels)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/classic")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.cuda.manual_seed_all(args.seed)  # ties: TNL004
    torch.backends.cudnn.benchmark = False  # ties: TNL007
    torch.backends.cudnn.deterministic = True  # ties: TNL007
    use_cuda = torch.cuda.is_available()  # ties: TNL004
    device = torch.device("cuda" if use_cuda else "cpu")  # ties: TNL003

    generator = torch.Generator().manual_seed(args.seed)
    train = synthetic_data(128, generator)
    loader = DataLoader(train, batch_size=args.batch_size, shuffle=True, generator=generator,
                        pin_memory=use_cuda, pin_memory_device="cuda")  # ties: TNL014

    model = Net().cuda()  # ties: TNL001
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # ties: TNL004

    losses = []
    for epoch in range(args.epochs):
        model.train()
        start.record()
        for images, labels in loader:
            images = images.cuda(non_blocking=True)  # ties: TNL001
            labels = labels.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        end.record()
        torch.cuda.synchronize()  # ties: TNL004
        print(f"epoch {epoch}: loss {losses[-1]:.4f}, {start.elapsed_time(end):.1f} ms")

    if next(model.parameters()).is_cuda:  # ties: TNL002
        print(f"peak memory {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")  # ties: TNL004

    os.makedirs(args.out, exist_ok=True)
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, os.path.join(args.out, "model.pt"))
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump({"losses": losses}, f)


if __name__ == "__main__":
    main()
