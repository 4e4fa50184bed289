"""Pinned host memory: pin_memory(), non-blocking copies both ways, the
DataLoader's pin_memory, and the device's host allocator as PyTorch sees it
(torch.accelerator.empty_host_cache(), torch.cuda's host memory statistics,
blocks not reused while a stream still reads or writes them)."""
import torch

from neuron_testing import run_python

N = 1 << 16


def busy_device():
    """Queues work that keeps the device busy for a while (tens of ms)."""
    a = torch.ones(1024, 1024, device="neuron")
    for _ in range(12):
        a = a @ a / 1024
    return a


def test_pinned_memory_and_non_blocking_copies():
    host = torch.arange(N, dtype=torch.float32).pin_memory()
    assert host.is_pinned() and not torch.ones(3).is_pinned()
    dev = host.to("neuron", non_blocking=True)
    back = torch.empty_like(host).pin_memory()
    back.copy_(dev * 2, non_blocking=True)
    torch.neuron.synchronize()
    assert torch.equal(back, host * 2)


def test_dataloader_pin_memory():
    ds = torch.utils.data.TensorDataset(torch.arange(8.0))
    (batch,) = next(iter(torch.utils.data.DataLoader(ds, batch_size=4, pin_memory=True)))
    assert batch.is_pinned()


def test_a_freed_source_is_not_reused_before_its_copy_ran():
    work = busy_device()
    src = torch.ones(N).pin_memory()
    dev = src.to("neuron", non_blocking=True)  # queued behind the matmuls
    del src                                    # freed while the copy waits
    reused = torch.empty(N).pin_memory().fill_(2.0)
    torch.neuron.synchronize()
    assert torch.equal(dev.cpu(), torch.ones(N)), "the copy read a reused buffer"
    del reused, work


def test_a_freed_destination_is_not_reused_before_its_copy_ran():
    x = torch.full((N,), 3.0, device="neuron")
    work = busy_device()
    dst = torch.empty(N).pin_memory()
    dst.copy_(x, non_blocking=True)
    del dst
    other = torch.zeros(N).pin_memory()  # must not be the block the copy writes into
    torch.neuron.synchronize()
    assert torch.equal(other, torch.zeros(N)), "the copy wrote into a reused buffer"
    del work


def test_host_memory_stats_as_torch_cuda_reports_them():
    torch.neuron.reset_accumulated_host_memory_stats()
    torch.accelerator.empty_host_cache()
    before = torch.neuron.host_memory_stats()
    keys = {f"{s}.{k}" for s in ("allocations", "allocated_bytes", "active_requests", "active_bytes")
            for k in ("current", "peak", "allocated", "freed")}
    keys |= {"num_host_alloc", "num_host_free"} | {f"host_{w}_time.{k}" for w in ("alloc", "free")
                                                   for k in ("total", "max", "min", "count", "avg")}
    assert set(before) == keys
    a = torch.empty(5000).pin_memory()  # 20000 bytes: a 32 KiB block
    now = torch.neuron.host_memory_stats()
    assert now["active_requests.current"] == before["active_requests.current"] + 1
    assert now["active_bytes.current"] - before["active_bytes.current"] == 32768
    assert now["num_host_alloc"] == before["num_host_alloc"] + 1
    del a
    cached = torch.neuron.host_memory_stats()
    assert cached["active_requests.current"] == before["active_requests.current"]
    assert cached["allocations.current"] == now["allocations.current"]  # kept for reuse
    b = torch.empty(6000).pin_memory()  # the same size class: reused
    assert torch.neuron.host_memory_stats()["num_host_alloc"] == now["num_host_alloc"]
    del b
    torch.accelerator.empty_host_cache()
    emptied = torch.neuron.host_memory_stats()
    assert emptied["allocations.current"] == cached["allocations.current"] - 1
    assert emptied["num_host_free"] == cached["num_host_free"] + 1
    assert torch.neuron.host_memory_stats_as_nested_dict()["allocations"]["current"] == emptied["allocations.current"]
    torch.neuron.reset_peak_host_memory_stats()
    assert torch.neuron.host_memory_stats()["allocations.peak"] == emptied["allocations.current"]


def test_empty_host_cache_after_initialisation_in_a_fresh_process():
    proc = run_python("""
        import torch, torchneuron
        torch.ones(4, device="neuron").sum().item()
        torch.ones(8).pin_memory()
        torch.accelerator.empty_host_cache()
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr

