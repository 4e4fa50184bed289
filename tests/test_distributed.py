"""torch.distributed's `neuron` backend, differential: every collective on
`neuron` tensors gives gloo's result on the same data as CPU tensors, bit for
bit, in one process group ("cpu:gloo,neuron:neuron": CPU tensors go to gloo,
neuron tensors to the neuron backend); collectives follow the work queued on
the caller's stream, the host goes on without waiting for them, side streams
order them, and a tensor freed while a collective uses it is not reused; DDP
on four ranks trains as one process on the global batch; bad arguments raise
clear errors."""
import io
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4
DELAY_S = 2.0  # how long rank 1 keeps the others waiting in the stream test


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collectives(rank, size):
    """Each collective on CPU tensors (gloo) and on neuron tensors (the
    neuron backend): (name, cpu results, neuron results)."""
    dev = torch.device("neuron", 0)
    g = torch.Generator().manual_seed(rank)
    data = torch.randn(3 * size, 3, generator=g)
    out = []

    def both(name, fn):
        cpu = fn("cpu")
        nrn = fn(dev)
        out.append((name, [t.cpu() for t in cpu], [t.cpu() for t in nrn]))

    def all_reduce(op):
        def fn(d):
            t = data.to(d) * 1  # queued work before the collective, on neuron
            dist.all_reduce(t, op=op)
            return [t]
        return fn

    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
        both(f"all_reduce {op}", all_reduce(op))

    def bitwise(d):
        t = torch.tensor([rank + 1, 6, 12], dtype=torch.int64, device=d)
        res = []
        for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
            u = t.clone()
            dist.all_reduce(u, op=op)
            res.append(u)
        return res
    both("all_reduce bitwise", bitwise)

    def broadcast(d):
        t = data.to(d).clone()
        dist.broadcast(t, src=1)
        return [t]
    both("broadcast", broadcast)

    def reduce(d):
        t = data.to(d).clone()
        dist.reduce(t, dst=0)
        return [t] if rank == 0 else []
    both("reduce", reduce)

    def all_gather(d):
        outs = [torch.empty_like(data, device=d) for _ in range(size)]
        dist.all_gather(outs, data.to(d))
        return outs
    both("all_gather", all_gather)

    def all_gather_into_tensor(d):
        o = torch.empty(size * data.shape[0], 3, device=d)
        dist.all_gather_into_tensor(o, data.to(d))
        return [o]
    both("all_gather_into_tensor", all_gather_into_tensor)

    def reduce_scatter_tensor(d):
        o = torch.empty(data.shape[0] // size, 3, device=d)
        dist.reduce_scatter_tensor(o, data.to(d))
        return [o]
    both("reduce_scatter_tensor", reduce_scatter_tensor)

    def all_to_all_single_uneven(d):
        splits_in = [1 + (2 * rank + j) % 3 for j in range(size)]  # rows to rank j
        splits_out = [1 + (2 * j + rank) % 3 for j in range(size)]  # rows from rank j
        o = torch.empty(sum(splits_out), 3, device=d)
        dist.all_to_all_single(o, data[:sum(splits_in)].to(d), splits_out, splits_in)
        return [o]
    both("all_to_all_single uneven", all_to_all_single_uneven)

    def gather_scatter(d):
        gathered = [torch.empty_like(data, device=d) for _ in range(size)] if rank == 0 else None
        dist.gather(data.to(d), gathered, dst=0)
        o = torch.empty_like(data, device=d)
        dist.scatter(o, [data.to(d) * (i + 1) for i in range(size)] if rank == 0 else None, src=0)
        return (gathered or []) + [o]
    both("gather, scatter", gather_scatter)

    def send_recv(d):  # in pairs: 0 -> 1, 2 -> 3
        t = data.to(d).clone()
        if rank % 2 == 0:
            dist.send(t * 5, dst=rank + 1)
            return []
        dist.recv(t, src=rank - 1)
        return [t]
    both("send, recv", send_recv)

    def exchange(d):  # every rank sends before it receives: neither may wait for its send first
        peer = rank ^ 1
        a, b, c = data.to(d) * (rank + 1), torch.empty_like(data, device=d), torch.empty_like(data, device=d)
        for req in [dist.isend(a, peer), dist.irecv(b, peer)]:
            req.wait()
        for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, a * 2, peer), dist.P2POp(dist.irecv, c, peer)]):
            req.wait()
        # a ring, coalesced on neuron as on NCCL (gloo issues the operations one by one)
        assert d == "cpu" or dist.group.WORLD._get_backend(torch.device(d)).supports_coalescing
        nxt, prev = (rank + 1) % size, (rank - 1) % size
        r = torch.empty_like(data, device=d)
        for req in dist.batch_isend_irecv([dist.P2POp(dist.irecv, r, prev), dist.P2POp(dist.isend, a * 3, nxt)]):
            req.wait()
        return [b * 1, c * 1, r * 1]
    both("isend, irecv exchange; batch_isend_irecv exchange and ring", exchange)

    def premul_sum(d):
        # gloo refuses PREMUL_SUM: the neuron backend pre-scales and sums, the CPU reference
        # scales by hand and sums on gloo
        t, f = data.to(d) * 1, torch.tensor(0.25, dtype=torch.float32, device=d)
        if t.device.type == "cpu":
            t *= 0.5
            dist.all_reduce(t)
            u = data[: data.shape[0] // size] * 1
            dist.reduce_scatter_tensor(u, data * f)
            return [t, u]
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
        u = torch.empty(data.shape[0] // size, 3, device=d)
        dist.reduce_scatter_tensor(u, data.to(d), op=dist._make_nccl_premul_sum(f))
        return [t, u]
    both("PREMUL_SUM", premul_sum)

    def coalesced(d):
        outs = [[torch.empty_like(data, device=d)] for _ in range(size)]  # per rank, per input
        dist.all_gather_coalesced(outs, [data.to(d)])
        return [out[0] for out in outs]
    both("all_gather_coalesced", coalesced)

    def after_queued_work(d):
        t = data.to(d)
        for _ in range(40):  # a chain of device work still queued when the collective is issued
            t = t * 1.5 - 0.25
        dist.all_reduce(t)
        return [t * 1]
    both("all_reduce after queued work", after_queued_work)

    def coalescing_manager(d):
        # with a device, the backend's start/endCoalescing: gloo has none, so the CPU runs without one
        from torch.distributed.distributed_c10d import _coalescing_manager
        ts = [data.to(d) * (i + 1) for i in range(3)]
        out = torch.empty(size * data.shape[0], 3, device=d)
        with _coalescing_manager(device=None if d == "cpu" else d, async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t)
        cm.wait()
        with _coalescing_manager(device=None if d == "cpu" else d):
            dist.all_gather_into_tensor(out, ts[0])
        return ts + [out]
    both("_coalescing_manager", coalescing_manager)

    def async_op(d):
        t = data.to(d) * 1
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        value = work.get_future().value()[0]
        assert value.device == t.device
        return [t, value]
    both("all_reduce async_op", async_op)
    return out


def _streams(rank, size):
    """A side stream's collective, ordered by that stream; and, with rank 1
    entering DELAY_S late, how long rank 0's host waited (it should not)."""
    dev = torch.device("neuron", 0)
    out = {}
    side = torch.neuron.Stream()
    with torch.neuron.stream(side):
        y = torch.full((6,), float(rank + 1), device=dev) * 2
        dist.all_reduce(y)
        y = y + 1
    torch.neuron.current_stream().wait_stream(side)
    out["side stream"] = y.cpu()

    dist.barrier()
    if rank == 1:
        time.sleep(DELAY_S)
    start = time.monotonic()
    t = torch.full((1024,), float(rank + 1), device=dev)
    work = dist.all_reduce(t, async_op=True)
    scratch = torch.full((4096,), float(rank), device=dev)
    dist.all_reduce(scratch)  # async_op=False: its wait() is the stream's, not the host's
    out["returned after"] = time.monotonic() - start
    out["completed at once"] = work.is_completed()
    scratch_ptr = scratch.data_ptr()
    del scratch  # recorded on the communication stream: not reused while the collective runs
    fresh = torch.empty(4096, device=dev)  # (no fill: some operators run on the host, after the stream)
    out["reused while in use"] = fresh.data_ptr() == scratch_ptr
    work.wait()
    out["waited after"] = time.monotonic() - start
    out["delayed"] = (t * 1).cpu()  # queued after wait(): sees the result
    out["finished after"] = time.monotonic() - start
    return out


def _worker(rank, size, port, queue):
    import torchneuron  # noqa: F401

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("cpu:gloo,neuron:neuron", rank=rank, world_size=size)
    try:
        result = {"collectives": _collectives(rank, size), "backend": dist.get_backend_config(),
                  "streams": _streams(rank, size)}
        g = dist.new_group(backend="neuron")
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            dist.all_reduce(torch.ones(2), group=g)  # a group of the neuron backend alone: PyTorch refuses
        with pytest.raises(RuntimeError, match="a collective's tensors must be on one neuron device"):
            dist.all_gather_into_tensor(torch.empty(2 * size, device="neuron:1"), torch.ones(2, device="neuron:0"))
        result["ddp"] = _ddp_losses(rank, size)
        dist.barrier()
        buffer = io.BytesIO()  # bytes, not shared tensors: this process ends before they are read
        torch.save(result, buffer)
        queue.put((rank, buffer.getvalue()))
    finally:
        dist.destroy_process_group()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _batches(steps=4, global_batch=8):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(global_batch, 8, generator=g), torch.randn(global_batch, 4, generator=g)) for _ in range(steps)]


def _ddp_losses(rank, size):
    """DDP on neuron: each rank its share of every global batch; the mean
    loss over ranks and the final parameters."""
    dev = torch.device("neuron", 0)
    model = torch.nn.parallel.DistributedDataParallel(_model().to(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in _batches():
        share = x.shape[0] // size
        xs, ys = x[rank * share:(rank + 1) * share].to(dev), y[rank * share:(rank + 1) * share].to(dev)
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        losses.append(total.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


@pytest.fixture(scope="module")
def results():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, WORLD, PORT, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    got = {}
    while len(got) < len(procs):  # a rank that dies fails the test at once, not at a timeout
        try:
            rank, r = queue.get(timeout=1)
            got[rank] = torch.load(io.BytesIO(r))
        except Exception:  # noqa: BLE001  (queue.Empty)
            assert all(p.is_alive() or p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return got


PORT = _free_port()


def test_every_collective_on_neuron_equals_gloo_on_the_cpu_bit_for_bit(results):
    for rank, r in results.items():
        assert "neuron:neuron" in r["backend"]
        for name, cpu, nrn in r["collectives"]:
            assert len(cpu) == len(nrn), (rank, name)
            for a, b in zip(cpu, nrn):
                assert a.dtype == b.dtype and a.shape == b.shape, (rank, name)
                assert torch.equal(a, b), (rank, name)


def test_collectives_follow_the_callers_streams_and_leave_the_host_free(results):
    total = sum(range(1, WORLD + 1))
    for rank, r in results.items():
        s = r["streams"]
        assert torch.equal(s["side stream"], torch.full((6,), 2.0 * total + 1)), rank
        assert torch.equal(s["delayed"], torch.full((1024,), float(total))), rank
    s = results[0]["streams"]  # rank 1 entered DELAY_S late
    assert s["returned after"] < DELAY_S / 2 and not s["completed at once"], s
    assert s["waited after"] < DELAY_S / 2, s  # wait() made the stream wait, not the host
    assert s["finished after"] >= DELAY_S * 0.9, s
    assert not s["reused while in use"], s


def test_ddp_on_four_ranks_trains_as_one_process_on_the_global_batch(results):
    model = _model().to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in _batches():
        loss = torch.nn.functional.mse_loss(model(x.to("neuron")), y.to("neuron"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    for rank, r in results.items():
        got_losses, got_params = r["ddp"]
        assert got_losses == pytest.approx(losses, rel=1e-6)
        for a, b in zip(got_params, model.parameters()):
            torch.testing.assert_close(a, b.detach().cpu(), rtol=1e-6, atol=1e-7)


def _under_memcheck(rank, world, port):
    import torchneuron.memcheck as mc

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.neuron.set_device(rank)
    dist.init_process_group("neuron", rank=rank, world_size=world)
    try:
        t = torch.full((1 << 16,), float(rank + 1), device="neuron")
        dist.all_reduce(t)
        outs = [torch.empty(4, device="neuron") for _ in range(world)]
        dist.all_gather(outs, torch.full((4,), float(rank), device="neuron"))
        sub = dist.new_group([0, 1])
        dist.all_reduce(t, group=sub)
        torch.neuron.synchronize()
        return {"protecting": mc.protecting(), "reports": [str(r) for r in mc.reports()],
                "sum": t[0].item(), "gathered": [o[0].item() for o in outs]}
    finally:
        dist.destroy_process_group()


def test_collectives_are_clean_under_the_memory_checker(monkeypatch):
    # gloo's threads run collectives on device memory: they must start with device access
    from distributed_testing import spawn_ranks

    monkeypatch.setenv("TORCHNEURON_MEMCHECK", "1")  # read by each rank's torchneuron at load
    ranks = spawn_ranks(_under_memcheck, 2)
    if not ranks[0]["protecting"]:
        pytest.skip("no memory protection keys on this host: host access protection is off")
    for r in ranks.values():
        assert r["reports"] == [] and r["sum"] == 6.0 and r["gathered"] == [0.0, 1.0]
