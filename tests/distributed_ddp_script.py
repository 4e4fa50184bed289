"""A training script for launchers (tests/test_distributed_launch.py runs it
under torchrun, on one node and on two network namespaces):
``init_process_group()`` with no backend, as torchrun's environment leaves
it, then DDP of a small MLP on `neuron`, each rank its share of every
global batch. Each rank writes what it saw to ``OUT/rank<R>.pt``.

    python -m torch.distributed.run --nproc-per-node=2 tests/distributed_ddp_script.py OUT
"""
import os
import sys

import torch
import torch.distributed as dist

STEPS = 4
GLOBAL_BATCH = 8


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(GLOBAL_BATCH, 8, generator=g), torch.randn(GLOBAL_BATCH, 4, generator=g))
            for _ in range(STEPS)]


def train(rank=0, world=1):
    """SGD; with world > 1, DDP on this rank's share of each batch. The
    losses (averaged over ranks) and the final parameters."""
    device = torch.device("neuron")
    net = model().to(device)
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    losses = []
    for x, y in batches():
        n = x.shape[0] // world
        x, y = x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]
        loss = torch.nn.functional.mse_loss(net(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        if world > 1:
            dist.all_reduce(total, op=dist.ReduceOp.AVG)
        losses.append(total.item())
    return losses, [p.detach().cpu() for p in net.parameters()]


def main(out):
    import torchneuron  # noqa: F401  (autoload imports it too; explicit for autoload-off setups)

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.neuron.set_device(local_rank % torch.neuron.device_count())
    dist.init_process_group()  # no backend: the accelerator's, neuron
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        peers = [None] * world
        dist.all_gather_object(peers, {"rank": rank, "node": int(os.environ["GROUP_RANK"]),
                                       "ifname": os.environ.get("GLOO_SOCKET_IFNAME")})
        losses, params = train(rank, world)
        seen = {
            "rank": rank, "world": world, "local_rank": local_rank,
            "backend config": dist.get_backend_config(),
            "default backend type": dist.distributed_c10d._get_default_group().name(),
            "master": os.environ["MASTER_ADDR"], "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
            "peers": peers, "losses": losses, "params": params,
        }
        dist.barrier()
        torch.save(seen, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
