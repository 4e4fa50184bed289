"""A DCGAN generator step with its --cuda flag and ngpu (pytorch/examples dcgan style)."""
import argparse
import random

import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--cuda", action="store_true", help="enables cuda")
parser.add_argument("--ngpu", type=int, default=1, help="number of GPUs to use")
parser.add_argument("--manualSeed", type=int, default=999)
opt = parser.parse_args([])
random.seed(opt.manualSeed)
torch.manual_seed(opt.manualSeed)
cudnn.benchmark = True  # ties: TNL007

if torch.cuda.is_available() and not opt.cuda:  # ties: TNL004
    print("WARNING: You have a CUDA device, so you should probably run with --cuda")

device = torch.device("cuda:0" if opt.cuda else "cpu")  # ties: TNL003
ngpu = int(opt.ngpu)


class Generator(nn.Module):
    def __init__(self, ngpu):
        super().__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(nn.ConvTranspose2d(4, 3, 4, 1, 0, bias=False), nn.Tanh())

    def forward(self, input):
        if input.is_cuda and self.ngpu > 1:  # ties: TNL002
            output = nn.parallel.data_parallel(self.main, input, range(self.ngpu))
        else:
            output = self.main(input)
        return output


netG = Generator(ngpu).to(device)
if (device.type == "cuda") and (ngpu > 1):  # ties: TNL003
    netG = nn.DataParallel(netG, list(range(ngpu)))
noise = torch.randn(2, 4, 1, 1, device=device)
fake = netG(noise)
print(tuple(fake.shape), round(fake.sum().item(), 3))
