"""Train a classifier the way pytorch/examples' imagenet does: DataParallel by default, one GPU with --gpu,
DistributedDataParallel with --multiprocessing-distributed (synthetic images, a tiny model)."""
import argparse
import os
import tempfile

import torch
import torch.backends.cudnn as cudnn
import torch.distributed as dist
import torch.nn as nn

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
parser.add_argument("--gpu", default=None, type=int, help="GPU id to use.")
parser.add_argument("--dist-backend", default="nccl", type=str, help="distributed backend")  # ties: TNL010
parser.add_argument("--resume", default="", type=str)
parser.add_argument("--world-size", default=-1, type=int)


def main():
    args = parser.parse_args([])
    ngpus_per_node = torch.cuda.device_count() if torch.cuda.is_available() else 1  # ties: TNL004
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5))
    if not torch.cuda.is_available():  # ties: TNL004
        print("using CPU, this will be slow")
    elif args.world_size > 1:
        dist.init_process_group(backend=args.dist_backend, world_size=args.world_size, rank=0)
        model = nn.parallel.DistributedDataParallel(model.cuda())  # ties: TNL001
    elif args.gpu is not None:
        torch.cuda.set_device(args.gpu)  # ties: TNL004
        model = model.cuda(args.gpu)  # ties: TNL001
    else:
        model = torch.nn.DataParallel(model).cuda()  # ties: TNL001,TNL026
    if torch.cuda.is_available():  # ties: TNL004
        if args.gpu:
            device = torch.device("cuda:{}".format(args.gpu))  # ties: TNL003
        else:
            device = torch.device("cuda")  # ties: TNL003
    else:
        device = torch.device("cpu")
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)
    if args.resume:
        loc = "cuda:{}".format(args.gpu)  # ties: TNL003
        checkpoint = torch.load(args.resume, map_location=loc)
        model.load_state_dict(checkpoint["state_dict"])
    cudnn.benchmark = True  # ties: TNL007

    images, target = torch.randn(8, 3, 6, 6), torch.arange(8) % 5
    for _ in range(2):
        if args.gpu is not None and torch.cuda.is_available():  # ties: TNL004
            images = images.cuda(args.gpu, non_blocking=True)  # ties: TNL001
        if torch.cuda.is_available():  # ties: TNL004
            target = target.cuda(args.gpu, non_blocking=True)  # ties: TNL001
        loss = criterion(model(images.to(device)), target.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"loss {loss.item():.3f}")
    torch.save({"state_dict": model.state_dict()}, os.path.join(tempfile.mkdtemp(), "checkpoint.pth.tar"))


if __name__ == "__main__":
    main()
