"""Asynchrony with stream semantics: the host runs ahead, reads and syncs wait,
events order streams, device errors surface at the next synchronising call."""
import time

import pytest
import torch

from neuron_testing import run_python


def _burst(n=6, size=1024):
    a = torch.randn(size, size, device="neuron")
    torch.neuron.synchronize()
    t0 = time.perf_counter()
    outs = [a @ a for _ in range(n)]
    launched = time.perf_counter() - t0
    return a, outs, launched, t0


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


def test_wait_stream_and_stream_switching():
    s = torch.neuron.Stream()
    a = torch.ones(1000, device="neuron")
    s.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(s):
        b = a * 3
    assert torch.neuron.current_stream() == torch.neuron.default_stream()
    torch.neuron.current_stream().wait_stream(s)
    assert b.sum().item() == 3000


def test_error_in_queued_op_is_raised_at_the_next_sync_naming_the_operator():
    x = torch.arange(10.0, device="neuron")
    bad = torch.tensor([1, 50], device="neuron")
    y = torch.index_select(x, 0, bad)  # queued: the bad index is only seen on the device
    with pytest.raises(RuntimeError, match=r"aten::index_select.*out of range"):
        y.cpu()
    # reported once; the device keeps working
    assert (x + 1).sum().item() == 55


def test_launch_blocking_makes_each_op_synchronous():
    r = run_python(
        """
        import torch
        a = torch.randn(1024, 1024, device="neuron")
        b = a @ a
        print("done", torch.neuron.current_stream().query())
        try:
            torch.index_select(torch.ones(3, device="neuron"), 0, torch.tensor([7], device="neuron"))
        except RuntimeError as e:
            print("raised at launch:", "index_select" in str(e))
        """,
        env={"NEURON_LAUNCH_BLOCKING": "1"},
    )
    assert "done True" in r.stdout, r.stderr
    assert "raised at launch: True" in r.stdout, r.stderr


def test_multi_output_op_whose_meta_kernel_disagrees_queues_after_one_synchronous_call():
    # Batch norm in eval mode: the meta function promises saved statistics the
    # CPU kernel returns empty. The first call per argument pattern runs
    # synchronously and records what the CPU kernel did; later ones queue.
    from torchneuron import _python_tasks

    bn = torch.nn.BatchNorm2d(8).to("neuron").eval()
    x = torch.randn(4, 8, 16, 16, device="neuron")
    bn(x)
    _python_tasks.launch("sleep", [x], lambda _: time.sleep(0.5))
    y = bn(x)
    assert not torch.neuron.current_stream().query()  # bn did not wait for the sleeping task
    torch.testing.assert_close(y.cpu(), bn.cpu()(x.cpu()), rtol=0, atol=0)
