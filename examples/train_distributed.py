#!/usr/bin/env python
"""Train the demo's GPT (examples/gpt_model.py) on several ``neuron`` ranks,
under DDP or FSDP2, launched by torchrun; then, on rank 0, the same model from
the same seed in one process on the global batch, and compare.

    python -m torch.distributed.run --nproc-per-node=2 examples/train_distributed.py --mode ddp
    python -m torch.distributed.run --nproc-per-node=2 examples/train_distributed.py --mode fsdp --steps 100

Every rank draws the same global batch (the demo's batch stream) and trains on
its share; the losses printed are averaged over ranks. ``init_process_group()``
is called with no backend: on a machine whose accelerator is ``neuron`` that
is the ``neuron`` backend. Outputs (rank 0, in ``--out``, default
``artifacts/distributed_<mode>/``): ``loss_curve.png`` (the distributed and
the one-process curves, and their relative difference) and ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_model as gm  # noqa: E402


def parse_args(argv=None):
    d_m, d_t = gm.GPTConfig(), gm.TrainConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--mode", choices=["ddp", "fsdp"], default="ddp",
                   help="DistributedDataParallel, or FSDP2's fully_shard on each block and the root")
    p.add_argument("--steps", type=int, default=d_t.steps)
    p.add_argument("--batch-size", type=int, default=d_t.batch_size, help="global batch, split over the ranks")
    p.add_argument("--block-size", type=int, default=d_m.block_size, help="context length")
    p.add_argument("--d-model", type=int, default=d_m.d_model)
    p.add_argument("--n-layer", type=int, default=d_m.n_layer)
    p.add_argument("--n-head", type=int, default=d_m.n_head)
    p.add_argument("--lr", type=float, default=d_t.lr, help="peak learning rate")
    p.add_argument("--warmup-steps", type=int, default=d_t.warmup_steps)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--compare-single", action=argparse.BooleanOptionalAction, default=True,
                   help="then train the same model in one process on the global batch (rank 0) and compare")
    p.add_argument("--out", help="output directory (default artifacts/distributed_<mode>)")
    return p.parse_args(argv)


def wrap(model: gm.GPT, mode: str, device_type: str) -> torch.nn.Module:
    if mode == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def train_distributed(device, mode, mc: gm.GPTConfig, tc: gm.TrainConfig, seed: int) -> gm.TrainResult:
    """gm.train's loop (same seeds, batches, schedule, clipping, AdamW), with
    each rank on its share of every global batch."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    tok, train_ids, val_ids = gm.load_dataset()
    model = gm.GPT(mc, generator=torch.Generator().manual_seed(seed)).to(device)
    n_params = gm.count_parameters(model)
    model = wrap(model, mode, device.type)
    gpt = model.module if mode == "ddp" else model  # fully_shard keeps the module itself
    optimizer = gm.make_optimizer(model, tc)
    data_gen = torch.Generator().manual_seed(seed + 1)
    share = tc.batch_size // world
    losses, pending = [], []
    t_start = time.perf_counter()
    for step in range(tc.steps):
        for group in optimizer.param_groups:
            group["lr"] = gm.lr_at(step, tc)
        x, y = gm.get_batch(train_ids, tc.batch_size, mc.block_size, data_gen, torch.device("cpu"))
        x, y = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
        _, loss = model(x.to(device), y.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if tc.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip, foreach=True)
        optimizer.step()
        pending.append(loss.detach())
        if (step + 1) % tc.log_every == 0 or step == tc.steps - 1:
            mean = torch.stack(pending)
            dist.all_reduce(mean, op=dist.ReduceOp.AVG)
            losses.extend(mean.cpu().tolist())
            pending.clear()
            if rank == 0:
                print(f"step {step + 1:>5}/{tc.steps}  loss {losses[-1]:.4f}  lr {gm.lr_at(step, tc):.2e}", flush=True)
    gm.synchronize(device)
    elapsed = time.perf_counter() - t_start
    val_loss = gm.evaluate(gpt, val_ids, tc, seed, device)  # every rank: FSDP2's forward gathers
    return gm.TrainResult(device=f"{world} x {device.type} ({mode})", losses=losses, val_loss=val_loss,
                          elapsed_s=elapsed, tokens_per_s=tc.steps * tc.batch_size * mc.block_size / elapsed,
                          peak_memory_bytes=None, peak_memory_kind="not measured", n_params=n_params,
                          model=None, optimizer=None, tokenizer=tok)


def plot(path: str, runs: list[gm.TrainResult], title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    two = len(runs) == 2
    fig, axes = plt.subplots(2 if two else 1, 1, figsize=(8, 6.5 if two else 4.5), sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1]} if two else None)
    ax = axes[0][0]
    for run, style in zip(runs, [dict(lw=2.0, color="tab:orange"), dict(lw=1.0, ls="--", color="tab:blue")]):
        ax.plot(range(1, len(run.losses) + 1), run.losses, label=f"{run.device} ({run.tokens_per_s:,.0f} tok/s)",
                **style)
    ax.set_ylabel("training loss (cross-entropy, nats)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    if two:
        rel = [max(abs(a - b) / max(abs(b), 1e-12), 1e-12) for a, b in zip(runs[0].losses, runs[1].losses)]
        ax2 = axes[1][0]
        ax2.plot(range(1, len(rel) + 1), rel, color="tab:green", lw=1.0, label="relative difference (0 drawn as 1e-12)")
        ax2.set_yscale("log")
        ax2.set_ylabel("relative difference")
        ax2.legend(loc="center right", fontsize="small")
        ax2.grid(alpha=0.3)
    axes[-1][0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    if "LOCAL_RANK" not in os.environ:
        sys.exit("error: launch with torchrun, e.g. python -m torch.distributed.run --nproc-per-node=2 "
                 "examples/train_distributed.py")
    import torchneuron  # noqa: F401  (autoload imports it too; explicit for autoload-off setups)

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.neuron.set_device(local_rank % torch.neuron.device_count())
    device = torch.device("neuron", torch.neuron.current_device())
    dist.init_process_group()  # no backend named: the accelerator's, neuron
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch_size % world:
        sys.exit(f"error: --batch-size {args.batch_size} does not split over {world} ranks")
    out = args.out or os.path.join("artifacts", f"distributed_{args.mode}")
    mc = gm.GPTConfig(block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head, d_model=args.d_model)
    mc.vocab_size = gm.load_dataset()[0].vocab_size
    tc = gm.TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup_steps)
    tc.betas = tuple(tc.betas)
    if rank == 0:
        print(f"torch {torch.__version__} | {world} ranks, backend {dist.get_backend_config()} | {args.mode} | "
              f"seed {args.seed}")
        print(f"model: {mc.n_layer} layers, d_model {mc.d_model}, {mc.n_head} heads, context {mc.block_size}; "
              f"{tc.steps} steps x global batch {tc.batch_size} ({tc.batch_size // world} per rank)")
    try:
        result = train_distributed(device, args.mode, mc, tc, args.seed)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0

    runs = [result]
    if args.compare_single:
        single = gm.train(device, seed=args.seed, model_config=mc, train_config=tc, keep_model=False)
        single.device = f"1 x {device.type} (one process, global batch)"
        runs.append(single)
    os.makedirs(out, exist_ok=True)
    png = os.path.join(out, "loss_curve.png")
    plot(png, runs, f"char-level GPT, {args.mode} on {world} ranks: {result.n_params:,} parameters")

    rows = [("tokens / s", [f"{r.tokens_per_s:,.0f}" for r in runs]),
            ("wall time", [f"{r.elapsed_s:.1f} s" for r in runs]),
            ("final loss", [f"{r.losses[-1]:.6f}" for r in runs]),
            ("val loss", [f"{r.val_loss:.6f}" for r in runs])]
    names = [r.device for r in runs]
    gm.print_table(names, rows)
    summary = {
        "torch_version": torch.__version__, "mode": args.mode, "world_size": world, "seed": args.seed,
        "model_config": vars(mc), "train_config": vars(tc),
        "runs": {"distributed": result.summary()} | ({"single": runs[1].summary()} if len(runs) == 2 else {}),
        "loss_curve_png": png,
    }
    if len(runs) == 2:
        rel = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(result.losses, runs[1].losses))
        summary["max_relative_loss_difference"] = rel
        print(f"max relative loss difference, {args.mode} on {world} ranks vs one process: {rel:.2e}")
    js = os.path.join(out, "summary.json")
    with open(js, "w") as f:
        json.dump(summary, f, indent=2, default=str)
    print(f"loss curve: {png}\nsummary:    {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
