"""Mixed-precision training in the style of PyTorch's AMP recipe (torch.cuda.amp).

    python amp_loop.py --steps 8 --out runs/amp
"""
import argparse
import json
import os

import torch
from torch.cuda.amp import GradScaler, autocast  # ties: TNL005

torch.backends.cuda.matmul.allow_tf32 = True  # ties: TNL008
torch.backends.cudnn.allow_tf32 = True  # ties: TNL007


class ScaledSiLU(torch.autograd.Function):
    """x * sigmoid(x) * scale, its backward written out."""

    @staticmethod
    @torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)  # ties: TNL006
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x * torch.sigmoid(x) * scale

    @staticmethod
    @torch.cuda.amp.custom_bwd  # ties: TNL006
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * ctx.scale * (s + x * s * (1 - s)), None


def make_model(width):
    return torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, 8))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--out", default="runs/amp")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = "cuda"  # ties: TNL003
    model = make_model(args.width).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = GradScaler(init_scale=2.0 ** 12)  # ties: TNL006
    loss_fn = torch.nn.MSELoss()

    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(32, 16, generator=g), torch.randn(32, 8, generator=g)) for _ in range(4)]

    losses = []
    torch.cuda.reset_peak_memory_stats()  # ties: TNL004
    for step in range(args.steps):
        x, y = (t.to(device) for t in data[step % len(data)])
        with autocast(dtype=torch.float16):  # ties: TNL006
            out = model(x)
            out = ScaledSiLU.apply(out, 0.5)
            loss = loss_fn(out, y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, scale {scaler.get_scale()}, "
          f"peak {torch.cuda.max_memory_allocated() / 2**20:.2f} MiB")  # ties: TNL004
    torch.cuda.empty_cache()  # ties: TNL004

    os.makedirs(args.out, exist_ok=True)
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, os.path.join(args.out, "model.pt"))
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump({"losses": losses, "scale": scaler.get_scale()}, f)


if __name__ == "__main__":
    main()
