"""Neuron tensors through torch.multiprocessing (torchneuron/sharing.py): the receiver's tensor is the sender's
device memory, with its metadata, as CUDA tensors are shared; CPU tensors still go PyTorch's way."""
import torch
import torch.multiprocessing as mp

TIMEOUT = 120


def _receiver(inbox, outbox):
    view, again, empty, host = inbox.get(timeout=TIMEOUT)
    outbox.put({
        "device": str(view.device), "dtype": view.dtype, "shape": tuple(view.shape), "stride": view.stride(),
        "offset": view.storage_offset(), "values": view.cpu(), "aliases": again.data_ptr() == view.data_ptr(),
        "empty": (str(empty.device), tuple(empty.shape)), "host_shared": host.is_shared(),
    })
    view.add_(100)  # the sender sees it, once this process has synchronised
    torch.neuron.synchronize()
    outbox.put("written")
    assert inbox.get(timeout=TIMEOUT) == "sender wrote"
    outbox.put(view.cpu())
    inbox.get(timeout=TIMEOUT)  # the sender keeps its tensor alive until the receiver is done


def test_neuron_tensor_through_a_queue_is_the_senders_memory():
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_receiver, args=(inbox, outbox))
    child.start()
    try:
        sent = (torch.arange(24, dtype=torch.float64).view(4, 6) * 2).t()[1:4]
        base = torch.arange(24, dtype=torch.float64, device="neuron").view(4, 6) * 2  # queued work, then sent
        view = base.t()[1:4]
        inbox.put((view, view, torch.empty(0, 3, device="neuron"), torch.ones(3)))
        got = outbox.get(timeout=TIMEOUT)
        assert got["device"] == "neuron:0" and got["dtype"] == torch.float64
        assert (got["shape"], got["stride"], got["offset"]) == (tuple(view.shape), view.stride(),
                                                                view.storage_offset())
        assert torch.equal(got["values"], sent)
        assert got["aliases"]  # one storage, received twice
        assert got["empty"] == ("neuron:0", (0, 3)) and got["host_shared"]
        assert outbox.get(timeout=TIMEOUT) == "written"
        expected = sent + 100
        assert torch.equal(view.cpu(), expected)
        view.mul_(-1)
        torch.neuron.synchronize()
        inbox.put("sender wrote")
        assert torch.equal(outbox.get(timeout=TIMEOUT), -expected)
        inbox.put("done")
        child.join(TIMEOUT)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
