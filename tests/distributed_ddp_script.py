"""A training script for launchers (tests/test_distributed_launch.py runs it
under torchrun, on one node and on two network namespaces):
``init_process_group()`` with no backend, as torchrun's environment leaves
it, then DDP of a small MLP on `neuron`, each rank its share of every
global batch. Each rank writes what it saw to ``OUT/rank<R>.pt``.

    python -m torch.distributed.run --nproc-per-node=2 tests/distributed_ddp_script.py OUT [KILL_AT]

With KILL_AT, the script checkpoints after every step (``OUT/checkpoint.pt``)
and resumes from the checkpoint it finds; on its first attempt the last rank
kills itself (SIGKILL) at step KILL_AT, for torchrun's ``--max-restarts``.
"""
import os
import signal
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


def train(rank=0, world=1, checkpoint=None, kill_at=None):
    """SGD; with world > 1, DDP on this rank's share of each batch. The
    losses (averaged over ranks) and the final parameters. With a
    `checkpoint` path: resumed from it if it exists, saved after each step."""
    device = torch.device("neuron")
    net = model().to(device)
    losses = []
    if checkpoint and os.path.exists(checkpoint):
        saved = torch.load(checkpoint, weights_only=False)
        net.load_state_dict(saved["model"])
        losses = saved["losses"]
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step, (x, y) in enumerate(batches()):
        if step < len(losses):
            continue  # done before the restart
        if kill_at == step and rank == world - 1 and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) == 0:
            os.kill(os.getpid(), signal.SIGKILL)
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
        if checkpoint:
            if rank == 0:
                state = {"model": getattr(net, "module", net).state_dict(), "losses": losses}
                torch.save(state, checkpoint + ".tmp")
                os.replace(checkpoint + ".tmp", checkpoint)  # a rank killed meanwhile leaves the last whole one
            if world > 1:
                dist.barrier()
    return losses, [p.detach().cpu() for p in net.parameters()]


def main(out, kill_at=None):
    import torchneuron  # noqa: F401  (autoload imports it too; explicit for autoload-off setups)

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.neuron.set_device(local_rank % torch.neuron.device_count())
    dist.init_process_group()  # no backend: the accelerator's, neuron
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        peers = [None] * world
        dist.all_gather_object(peers, {"rank": rank, "node": int(os.environ["GROUP_RANK"]),
                                       "ifname": os.environ.get("GLOO_SOCKET_IFNAME")})
        checkpoint = os.path.join(out, "checkpoint.pt") if kill_at is not None else None
        losses, params = train(rank, world, checkpoint, kill_at)
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
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
