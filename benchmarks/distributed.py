"""torch.distributed on `neuron` against gloo on CPU tensors. all_reduce:
bus bandwidth from 4 KiB to 256 MiB (float32, SUM) on two spawned ranks of one
"cpu:gloo,neuron:neuron" group, so both run the same gloo algorithm; the
neuron backend runs it on host views of device memory, so the target is at
least 0.95x gloo's bandwidth at every size.

Each repeat starts both ranks together (a barrier) and times a run of
all_reduces back to back, as nccl-tests times its bus bandwidth, each one
waited for until its result is on the device (on `neuron`, a
synchronisation after every one); the two backends alternate repeat by
repeat, so drift on a shared machine hits both. Per size: the median time of
one all_reduce, the bus bandwidth (2 (n - 1) / n bytes per rank, NCCL's
convention for all_reduce), and neuron's bandwidth over gloo's. A run, not a
single call: on a 2-core virtual machine a thread waiting for its peer is
now and then descheduled for milliseconds, and a single small call's time is
mostly whether that happened (its median moves tenfold between runs).

A DDP training step (an MLP, the same per-rank batch) on 1 and 2 ranks: the
median step time on `neuron` and on CPU tensors, alternating step by step, and
the CPU's time over neuron's.

    .venv/bin/python benchmarks/distributed.py [--smoke]

A group in benchmarks/run.py's sense: ``STEPS``, ``run(cfg, bar)``, and
``targets(results)`` for the targets table.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BANDWIDTH_RATIO_MIN = 0.95
WORLD = 2
STEPS = 1
KiB, MiB = 1024, 1024 * 1024


def sizes(smoke: bool) -> list[int]:
    """Bytes per rank: powers of 4 from 4 KiB to 256 MiB (smoke: three, to 256 KiB)."""
    top = 256 * KiB if smoke else 256 * MiB
    out, n = [], 4 * KiB
    while n <= top:
        out.append(n)
        n *= 4 if not smoke else 8
    return out


def repeats_for(nbytes: int, smoke: bool) -> int:
    if smoke:
        return 3
    return 21 if nbytes <= 1 * MiB else 9 if nbytes <= 16 * MiB else 5


def calls_per_repeat(nbytes: int, smoke: bool) -> int:
    """All_reduces timed back to back in one repeat: a few milliseconds' worth at least."""
    if smoke:
        return 2
    return 50 if nbytes <= 256 * KiB else 10 if nbytes <= 4 * MiB else 3 if nbytes <= 16 * MiB else 1


def _rank(rank, world, port, plan):
    import statistics

    import torch
    import torch.distributed as dist

    import torchneuron  # noqa: F401

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.neuron.set_device(rank)
    dist.init_process_group("cpu:gloo,neuron:neuron", rank=rank, world_size=world)
    neuron = torch.device("neuron", rank)
    try:
        out = {}
        for nbytes, repeats, calls in plan:
            # random data, the same on both backends, reset before each repeat (a SUM doubles it per call)
            data = torch.randn(nbytes // 4, generator=torch.Generator().manual_seed(rank))
            tensors = {"gloo": data.clone(), "neuron": data.to(neuron)}
            sources = {"gloo": data, "neuron": data.to(neuron)}

            def once(k):
                t = tensors[k]
                t.copy_(sources[k])
                if t.device.type == "neuron":
                    torch.neuron.synchronize(neuron)
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(calls):
                    dist.all_reduce(t)
                    if t.device.type == "neuron":
                        torch.neuron.synchronize(neuron)
                return (time.perf_counter() - t0) / calls

            for k in tensors:  # warm-up: gloo's pairs, the allocator's blocks
                once(k)
            samples = {k: [] for k in tensors}
            for _ in range(repeats):
                for k in tensors:
                    samples[k].append(once(k))
            # every rank must agree on the result: the slowest rank's time is the collective's
            gathered = [None] * world
            dist.all_gather_object(gathered, samples)
            per_repeat = {k: [max(g[k][i] for g in gathered) for i in range(repeats)] for k in tensors}
            factor = 2 * (world - 1) / world
            r = {"bytes": nbytes, "repeats": repeats, "calls_per_repeat": calls}
            for k, ts in per_repeat.items():
                r[f"{k}_s"] = statistics.median(ts)
                r[f"{k}_busbw_GBps"] = factor * nbytes / r[f"{k}_s"] / 1e9
            r["ratio_busbw"] = r["neuron_busbw_GBps"] / r["gloo_busbw_GBps"]
            # the two results agree bit for bit: same algorithm, same data, the same number of calls
            r["equal_results"] = bool(torch.equal(tensors["neuron"].cpu(), tensors["gloo"]))
            out[nbytes] = r
            del tensors
        return out
    finally:
        dist.destroy_process_group()


def _run_ranks(target, world: int, args: tuple, timeout: float):
    """Runs `target(rank, world, port, *args)` in `world` spawned processes and returns rank 0's value; a rank
    that dies or raises fails the run at once (tests/distributed_testing.py)."""
    from tests.distributed_testing import spawn_ranks

    return spawn_ranks(target, world, *args, timeout=timeout)[0]


def measure(smoke: bool) -> dict:
    plan = [(n, repeats_for(n, smoke), calls_per_repeat(n, smoke)) for n in sizes(smoke)]
    result = _run_ranks(_rank, WORLD, (plan,), timeout=1800)
    return {"world_size": WORLD, "dtype": "float32", "sizes": {_label(n): r for n, r in result.items()}}


def _ddp_rank(rank, world, port, steps):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.neuron.set_device(rank)
    dist.init_process_group("cpu:gloo,neuron:neuron", rank=rank, world_size=world)
    try:
        # The models die (at _ddp_steps' return) before their group: a DDP model that outlives
        # destroy_process_group holds the group's last reference, and the group is then destroyed in the model's
        # destructor with the GIL held, while gloo's worker thread may need the GIL to drop a finished
        # collective's Python tensors. A deadlock of PyTorch's own, on CPU tensors as well.
        return _ddp_steps(rank, world, steps)
    finally:
        dist.destroy_process_group()


def _ddp_steps(rank, world, steps) -> dict:
    import statistics

    import torch
    import torch.distributed as dist

    runs = {}
    for name, dev in (("cpu", torch.device("cpu")), ("neuron", torch.device("neuron", rank))):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
        ddp = torch.nn.parallel.DistributedDataParallel(model.to(dev))
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        x, y = torch.randn(64, 256, device=dev), torch.randn(64, 256, device=dev)
        runs[name] = (ddp, opt, x, y)

    def step(name):
        ddp, opt, x, y = runs[name]
        dist.barrier()
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()  # the step is done: its loss is on the host
        return time.perf_counter() - t0

    for name in runs:  # warm-up: DDP's buckets, gloo's pairs, the allocator
        step(name)
    samples = {name: [] for name in runs}
    for _ in range(steps):
        for name in runs:
            samples[name].append(step(name))
    gathered = [None] * world
    dist.all_gather_object(gathered, samples)
    med = {k: statistics.median(max(g[k][i] for g in gathered) for i in range(steps)) for k in samples}
    return {"ranks": world, "steps": steps, "cpu_step_s": med["cpu"], "neuron_step_s": med["neuron"],
            "ratio_cpu_over_neuron": med["cpu"] / med["neuron"]}


def measure_ddp(smoke: bool) -> dict:
    return {f"{world} rank{'s' if world > 1 else ''}": _run_ranks(_ddp_rank, world, (3 if smoke else 30,), timeout=900)
            for world in (1, 2)}


def _label(nbytes: int) -> str:
    return f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // KiB} KiB"


def run(cfg, bar) -> dict:
    out = {"all_reduce": measure(cfg.smoke), "ddp_step": measure_ddp(cfg.smoke)}
    bar.update(1)
    return out


def targets(res: dict) -> list[dict]:
    r = res.get("distributed", {}).get("all_reduce")
    if r is None:
        return []
    return [{"group": "distributed", "name": f"all_reduce {label}",
             "figure": "neuron bus bandwidth / gloo's on CPU tensors", "value": s["ratio_busbw"],
             "threshold": f">= {BANDWIDTH_RATIO_MIN}", "met": bool(s["ratio_busbw"] >= BANDWIDTH_RATIO_MIN)}
            for label, s in r["sizes"].items()]


def markdown(res: dict) -> str:
    r = res["all_reduce"]
    rows = [f"| {label} | {s['gloo_busbw_GBps']:.3f} | {s['neuron_busbw_GBps']:.3f} | {s['ratio_busbw']:.2f} |"
            for label, s in r["sizes"].items()]
    return ("## torch.distributed all_reduce\n\nBus bandwidth (GB/s) of a float32 SUM on "
            f"{r['world_size']} ranks of one process group (benchmarks/distributed.py): gloo on CPU tensors "
            "and the neuron backend (gloo on host views of device memory); per all_reduce, from runs of "
            "them back to back (as nccl-tests measures), median over repeats.\n\n"
            "| bytes per rank | gloo, CPU tensors | neuron | neuron / gloo |\n|---|---|---|---|\n"
            + "\n".join(rows) + "\n" + _ddp_markdown(res.get("ddp_step")))


def _ddp_markdown(r) -> str:
    if not r:
        return ""
    rows = [f"| {k} | {s['cpu_step_s'] * 1e3:.2f} | {s['neuron_step_s'] * 1e3:.2f} | {s['ratio_cpu_over_neuron']:.2f} |"
            for k, s in r.items()]
    return ("\nA DDP training step (MLP 256-1024-256, batch 64 per rank; median ms, the slowest rank's):\n\n"
            "| ranks | CPU tensors, gloo | neuron | CPU / neuron |\n|---|---|---|---|\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    from benchmarks.common import run_alone

    run_alone("distributed", run, targets)
