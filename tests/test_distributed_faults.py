"""Faults of torch.distributed's `neuron` backend: bad arguments raise at the
call, as gloo's on CPU tensors do; a hung peer and a killed one make every
surviving rank raise DistBackendError naming the operation, the group, the
rank and the elapsed time, within the group's timeout and a few seconds, and
then exit; a mismatched collective is reported under
TORCH_DISTRIBUTED_DEBUG=DETAIL as gloo's is; monitored_barrier works on a
group of the neuron backend."""
import datetime
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from distributed_testing import attempt, spawn_ranks

TIMEOUT_S = 3  # the groups' timeout in the hang test


def _bad_arguments(rank, size, dev):
    """Each bad call on `dev`: its exception's type name, or "ok"."""
    def run(fn):
        r = attempt(fn)
        return r["error"].split(":")[0] if "error" in r else "ok"

    ones = lambda *shape: torch.ones(*shape, device=dev)  # noqa: E731
    return {
        "all_gather_into_tensor, wrong output size": run(
            lambda: dist.all_gather_into_tensor(ones(2 * size + 1), ones(2))),
        "all_gather_into_tensor, other dtype": run(
            lambda: dist.all_gather_into_tensor(torch.empty(2 * size, dtype=torch.int64, device=dev), ones(2))),
        "reduce_scatter_tensor, wrong input size": run(
            lambda: dist.reduce_scatter_tensor(ones(2), ones(2 * size + 1))),
        "all_gather, short list": run(lambda: dist.all_gather([ones(2)], ones(2))),
        "all_gather, other shape": run(lambda: dist.all_gather([ones(2)] * (size - 1) + [ones(3)], ones(2))),
        "all_to_all_single, bad splits": run(
            lambda: dist.all_to_all_single(ones(4), ones(4), [1] * size, [3] * size)),
        "gather, long list on every rank": run(lambda: dist.gather(ones(2), [ones(2)] * (size + 1), dst=rank)),
        "all_to_all, long list": run(lambda: dist.all_to_all([ones(2)] * size, [ones(2)] * (size + 1))),
        "broadcast, bad root": run(lambda: dist.broadcast(ones(2), src=size + 2)),
    }


def _faults(rank, size, port):
    import torchneuron  # noqa: F401

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    dist.init_process_group("cpu:gloo,neuron:neuron", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=30))
    dev = torch.device("neuron", 0)
    out = {"bad arguments": {d: _bad_arguments(rank, size, d) for d in ("cpu", "neuron")}}
    t = torch.ones(4, device=dev)
    dist.all_reduce(t)  # no bad call above reached the peers: the group still works
    out["after bad arguments"] = t.cpu()

    neuron_only = dist.new_group(backend="neuron")
    dist.monitored_barrier(neuron_only, timeout=timeout)
    dist.monitored_barrier(timeout=timeout)
    out["monitored_barrier"] = "ok"

    # a hung peer: the last rank does not enter this group's all_reduce
    hung = dist.new_group(backend="neuron", timeout=timeout)
    killed = dist.new_group(backend="neuron", timeout=timeout)
    if rank == size - 1:
        time.sleep(TIMEOUT_S + 4)
    else:
        start = time.monotonic()
        u = torch.ones(4, device=dev)
        dist.all_reduce(u, group=hung)
        out["hung returned after"] = time.monotonic() - start  # the host goes on; the stream fails
        out["hung"] = attempt(u.cpu)
        out["hung raised after"] = time.monotonic() - start
        torch.neuron.reset_errors()
    dist.barrier()

    # a killed peer: the last rank dies while the others are in an all_reduce
    if rank == size - 1:
        time.sleep(1)
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    v = torch.ones(1 << 16, device=dev)
    dist.all_reduce(v, group=killed)
    out["killed"] = attempt(v.cpu)
    out["killed raised after"] = time.monotonic() - start
    torch.neuron.reset_errors()
    return out


@pytest.fixture(scope="module")
def faults():
    start = time.monotonic()
    got = spawn_ranks(_faults, 3, timeout=120, may_die=(2,))
    got["exited after"] = time.monotonic() - start
    return got


def test_bad_arguments_raise_at_the_call_as_gloos_do(faults):
    for rank in (0, 1):
        r = faults[rank]
        assert r["bad arguments"]["neuron"] == r["bad arguments"]["cpu"], rank
        assert set(r["bad arguments"]["neuron"].values()) == {"RuntimeError"}, r["bad arguments"]
        assert torch.equal(r["after bad arguments"], torch.full((4,), 3.0))
        assert r["monitored_barrier"] == "ok"


def _check_error(error, rank, op, group, within):
    assert error.startswith("DistBackendError: "), error
    for part in (f"neuron backend: {op} on group {group}", f"rank {rank} of 3", "failed after", "timeout 3.0 s"):
        assert part in error, (part, error)
    took = float(error.split("failed after ")[1].split(" s")[0])
    assert took <= within, error


def test_a_hung_peer_makes_every_other_rank_raise_within_the_timeout(faults):
    for rank in (0, 1):
        r = faults[rank]
        assert r["hung returned after"] < TIMEOUT_S, r  # the call itself did not wait for the peer
        _check_error(r["hung"]["error"], rank, "all_reduce", "", TIMEOUT_S + 5)
        assert TIMEOUT_S - 0.5 <= r["hung raised after"] <= TIMEOUT_S + 10, r


def test_a_killed_peer_makes_every_other_rank_raise_and_exit(faults):
    for rank in (0, 1):
        r = faults[rank]
        _check_error(r["killed"]["error"], rank, "all_reduce", "", TIMEOUT_S + 5)
        assert r["killed raised after"] <= TIMEOUT_S + 10, r
    # the hang (3 s), the kill and the start-up of three ranks, not a rank waiting forever
    assert faults["exited after"] < 90


def _mismatch(rank, size, port):
    import torchneuron  # noqa: F401

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("cpu:gloo,neuron:neuron", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=20))
    out = {}
    for d in ("cpu", "neuron"):
        t = torch.ones(4 + rank, device=d)
        out[d, "shape"] = attempt(dist.all_reduce, t)
        out[d, "op"] = attempt(dist.all_reduce if rank == 0 else lambda x: dist.broadcast(x, src=0),
                               torch.ones(4, device=d))
    u = torch.ones(4, device="neuron")
    dist.all_reduce(u)
    out["after"] = u.cpu()
    dist.destroy_process_group()
    return out


def test_a_mismatched_collective_is_reported_under_debug_detail_as_with_gloo(monkeypatch):
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    got = spawn_ranks(_mismatch, 2, timeout=120)
    for rank, r in got.items():
        for case in ("shape", "op"):
            cpu, nrn = r["cpu", case]["error"], r["neuron", case]["error"]
            assert cpu.split(":")[0] == nrn.split(":")[0] == "RuntimeError", (cpu, nrn)
            assert "Detected mismatch between collectives on ranks" in nrn, nrn
        assert "TensorShape=[4" in r["neuron", "shape"]["error"]
        assert "OpType=BROADCAST" in r["neuron", "op"]["error"] and "OpType=ALLREDUCE" in r["neuron", "op"]["error"]
        assert torch.equal(r["after"], torch.full((4,), 2.0))
