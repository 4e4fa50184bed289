"""A collective issued under Python state (activation checkpointing's saved-tensor hooks) while
the host waits for the device holding the interpreter's lock, as DTensor's dispatch holds it
around each operator: the same program on CPU tensors over gloo and on `neuron` tensors, with a
peer that arrives late so that gloo's threads start that collective only once the host waits.
Gloo's threads take on the thread-local state a call was made in, and copying Python objects
takes the lock; on `neuron` they must take on none of the caller's state, or they wait for the
lock while its holder waits for them (tensor parallelism under TorchTitan hung this way)."""
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate

from distributed_testing import spawn_ranks

TIMEOUT_S = 5  # the group's: a host that never wakes fails the test within it and the watchdog's grace
LATE_S = 0.5   # how long rank 1 keeps rank 0's gloo threads waiting in the first collectives
N = 1024


def _program(rank, world, device):
    xs = [torch.full((N,), float(rank + 1 + 10 * i), device=device) for i in range(3)]
    torch.accelerator.synchronize()  # an idle stream: the host makes gloo's calls itself, in its state
    if rank == 1:
        time.sleep(LATE_S)
    # two collectives keep gloo's two threads waiting for the peer; the third waits in its queue
    works = [dist.all_reduce(xs[0], async_op=True), dist.all_reduce(xs[1], async_op=True)]
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        works.append(dist.all_reduce(xs[2], async_op=True))
    for w in works:
        w.wait()
    mesh = init_device_mesh(device, (world,))
    # DTensor's .item(): the host waits for the collectives holding the interpreter's lock
    total = DTensor.from_local(torch.cat(xs), mesh, [Replicate()], run_check=False).sum().item()
    return [x.cpu() for x in xs], total


def _ranks(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("cpu:gloo,neuron:neuron", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    try:
        return {device: _program(rank, world, device) for device in ("cpu", "neuron")}
    finally:
        dist.destroy_process_group()


def test_a_collective_issued_under_saved_tensor_hooks_finishes_while_the_host_holds_the_lock():
    got = spawn_ranks(_ranks, 2, timeout=60)
    for rank, r in got.items():
        (cpu_xs, cpu_total), (xs, total) = r["cpu"], r["neuron"]
        for i, (a, b) in enumerate(zip(cpu_xs, xs)):
            assert torch.equal(a, b) and torch.equal(b, torch.full((N,), 3.0 + 20 * i)), (rank, i)
        assert total == cpu_total, rank
