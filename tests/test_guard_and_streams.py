"""The device guard and streams: the current device and its context manager;
asynchrony with stream semantics (the host runs ahead, reads and syncs wait);
events time work and order streams."""
import time

import pytest
import torch


def test_current_device_and_context():
    assert torch.neuron.current_device() == 0
    with torch.neuron.device(1):
        assert torch.neuron.current_device() == 1
        assert torch.empty(2, device="neuron").device == torch.device("neuron:1")
    assert torch.neuron.current_device() == 0
    torch.neuron.set_device(1)
    try:
        assert torch.accelerator.current_device_index() == 1
    finally:
        torch.neuron.set_device(0)


def _burst(n=6, size=1024):
    a = torch.randn(size, size, device="neuron")
    a @ a  # the first call of a signature runs synchronously (errors at the call)
    torch.neuron.synchronize()
    t0 = time.perf_counter()
    outs = [a @ a for _ in range(n)]
    launched = time.perf_counter() - t0
    return a, outs, launched, t0


@pytest.mark.differs_under("stream_sanitizer", "it adds host work to every launch, which this test times")
def test_host_returns_before_device_finishes():
    a, outs, launched, t0 = _burst()
    assert not torch.neuron.current_stream().query()  # still running
    torch.neuron.synchronize()
    finished = time.perf_counter() - t0
    assert torch.neuron.current_stream().query()
    assert launched < finished / 5, (launched, finished)
    torch.testing.assert_close(outs[-1].cpu(), a.cpu() @ a.cpu(), rtol=0, atol=0)


def test_reads_wait_for_exactly_their_work():
    a = torch.randn(512, 512, device="neuron")
    b = a
    for _ in range(5):
        b = b @ a / 100
    expected = a.cpu()
    e = expected
    for _ in range(5):
        e = e @ expected / 100
    assert torch.equal(b.cpu(), e)  # .cpu() waited for the chain
    assert b.sum().item() == pytest.approx(e.sum().item(), rel=1e-5)


def test_events_query_synchronize_and_time():
    start = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    a = torch.randn(1024, 1024, device="neuron")
    start.record()
    for _ in range(4):
        a @ a
    end.record()
    assert not end.query()
    end.synchronize()
    assert end.query()
    ms = start.elapsed_time(end)
    assert 0 < ms < 60_000
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        torch.neuron.Event().elapsed_time(end)


def test_two_streams_ordered_by_an_event():
    producer, consumer = torch.neuron.Stream(), torch.neuron.Stream()
    assert producer != consumer
    big = torch.randn(1024, 1024, device="neuron")
    torch.neuron.synchronize()
    with torch.neuron.stream(producer):
        x = big @ big  # slow
        x.add_(1)
        ready = torch.neuron.Event()
        ready.record()
    with torch.neuron.stream(consumer):
        consumer.wait_event(ready)
        y = x * 2
    consumer.synchronize()
    torch.testing.assert_close(y.cpu(), (big.cpu() @ big.cpu() + 1) * 2, rtol=0, atol=0)


@pytest.mark.skipif(torch.neuron.device_count() < 2, reason="needs two neuron devices")
def test_a_copy_between_devices_holds_its_source_until_it_ran():
    """As on CUDA: the copy waits for the source's stream, and the source's stream for the copy, so the
    source's memory freed and reused on its device right after the call still holds the source for the copy."""
    busy = torch.randn(768, 768, device="neuron:1")
    want = torch.randn(1 << 16)
    for _ in range(3):
        a = want.to("neuron:0")
        torch.neuron.synchronize()
        for _ in range(4):
            busy = busy @ busy / 768      # the destination's stream is busy: the copy waits behind it
        b = a.to("neuron:1")
        ptr = a.data_ptr()
        del a                             # back in neuron:0's pool at once
        z = torch.full((1 << 16,), 5.0, device="neuron:0")
        assert z.data_ptr() == ptr        # the same memory, overwritten on neuron:0's stream
        torch.testing.assert_close(b.cpu(), want, rtol=0, atol=0)


def test_wait_stream_and_stream_switching():
    s = torch.neuron.Stream()
    a = torch.ones(1000, device="neuron")
    s.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(s):
        b = a * 3
    assert torch.neuron.current_stream() == torch.neuron.default_stream()
    torch.neuron.current_stream().wait_stream(s)
    assert b.sum().item() == 3000

