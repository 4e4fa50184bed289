"""Pinned host memory: pin_memory(), non-blocking copies both ways, and the
DataLoader's pin_memory."""
import torch


def test_pinned_memory_and_non_blocking_copies():
    host = torch.arange(1 << 16, dtype=torch.float32).pin_memory()
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

