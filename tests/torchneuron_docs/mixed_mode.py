"""Mixed mode: a compiled block inside an eager training loop, the model left on the CPU and compiled
with backend="neuron" (its inputs copied to the device, as TorchNeuron does), with autocast, gradient
clipping and a learning-rate schedule. The losses must fall and stay finite; the compiled block's
gradients reach the CPU parameters."""
import torch
import torch.nn as nn

torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm, self.ff = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        return x + self.ff(self.norm(x))


device = torch.device("neuron")
embed, head = nn.Embedding(100, 32).to(device), nn.Linear(32, 100).to(device)
block = torch.compile(Block(32).to(device), backend="neuron")  # the compiled part
params = [*embed.parameters(), *block.parameters(), *head.parameters()]
opt = torch.optim.AdamW(params, lr=3e-3)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20)
tokens = torch.randint(0, 100, (8, 17), device=device)
losses = []
for step in range(20):
    with torch.autocast(device_type="neuron", dtype=torch.bfloat16):
        logits = head(block(embed(tokens[:, :-1])))  # eager, compiled, eager
    loss = nn.functional.cross_entropy(logits.float().reshape(-1, 100), tokens[:, 1:].reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    losses.append(loss.item())
print("losses:", [round(v, 3) for v in losses[::5]], "...", round(losses[-1], 3))
assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0] - 0.5

cpu_block = Block(8)  # left on the CPU: compiled for neuron all the same
out = torch.compile(cpu_block, backend="neuron")(torch.randn(2, 8))
out.sum().backward()
assert out.device.type == "neuron" and all(p.grad is not None and p.grad.device.type == "cpu"
                                           for p in cpu_block.parameters())
print("OK mixed mode")
