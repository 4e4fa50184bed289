"""The stream sanitizer (torchneuron/sanitizers/stream.py, docs/sanitizers.md): seeded
races are each reported with the right accesses, and correct multi-stream
programs (events, wait_stream, synchronisations) and the demo model's
training step run without a report."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchneuron
from neuron_testing import FusableFrom
from torchneuron import sanitizer
from torchneuron.sanitizer import StreamRaceError, StreamRaceWarning, stream_sanitizer

N = 1 << 12  # small enough for the lean path

# Every test here turns a sanitizer on and off around its own program.
pytestmark = pytest.mark.differs_under("stream_sanitizer", "each test runs its own sanitizer, and one is on already")


def busy(stream):
    """Queues a long task on `stream`, so that what follows really overlaps."""
    with torch.neuron.stream(stream):
        m = torch.randn(512, 512, device="neuron")
        for _ in range(6):
            m = m @ m / 512
    return m


def race(fn):
    with pytest.raises(StreamRaceError) as info:
        with stream_sanitizer():
            fn()
    torch.neuron.synchronize()
    return info.value


def clean(fn):
    """`fn`'s program reports no race; what it returns lives until its streams finished (a tensor used on
    another stream and freed before that work ran needs record_stream, which the memory checker reports)."""
    with stream_sanitizer() as san:
        kept = fn()
    torch.neuron.synchronize()
    del kept
    assert san.reports == [], "\n".join(str(r) for r in san.reports)
    return san


def test_two_streams_without_an_event():
    s = torch.neuron.Stream()

    def program():
        a = torch.ones(N, device="neuron")      # written on the default stream
        with torch.neuron.stream(s):
            return a * 2                        # read on s: nothing orders the two

    err = race(program)
    (r,) = err.reports
    assert r.current.op == "aten::mul.Tensor" and not r.current.write and r.current.names == ["self"]
    assert r.previous.op == "aten::ones" and r.previous.write and r.previous.is_output
    assert r.current.stream != r.previous.stream and tuple(r.current.shape) == (N,)
    text = str(err)
    assert "aten::mul.Tensor reading argument 'self'" in text and "stream 0 of neuron:0 (the default stream)" in text
    assert "aten::ones writing its result" in text and "allocated as a (4096,) float32 result of aten::ones" in text
    assert "test_sanitizer.py" in text and "return a * 2" in text  # the Python stacks


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_nested_tensor_race_names_its_components():
    s = torch.neuron.Stream()
    parts = [torch.ones(2, 6), torch.ones(5, 6)]

    def program(ordered: bool):
        a = torch.nested.nested_tensor(parts, device="neuron") * 3   # written on the default stream
        if ordered:
            s.wait_stream(torch.neuron.current_stream())
        with torch.neuron.stream(s):
            return a.sin()                                            # read on s

    (r,) = race(lambda: program(False)).reports
    assert r.current.op == "aten::sin" and r.previous.op == "aten::mul.Tensor"
    assert tuple(r.current.shape) == ((2, 6), (5, 6))
    assert (r.current.lo - r.storage.base, r.current.hi - r.storage.base) == (0, 7 * 6 * 4)
    clean(lambda: program(True))


def test_write_after_read_on_another_stream():
    s = torch.neuron.Stream()
    a = torch.ones(N, device="neuron")
    torch.neuron.synchronize()

    def program():
        with torch.neuron.stream(s):
            b = a.sum()                         # read on s
        a.add_(1)                               # written on the default stream meanwhile
        return b

    (r,) = race(program).reports
    assert r.current.op == "aten::add_.Tensor" and r.current.write and r.previous.op == "aten::sum"


@pytest.mark.parametrize("sync", ["event", "wait_stream", "stream_synchronize", "device_synchronize",
                                  "event_synchronize", "accelerator_synchronize", "item"])
def test_ordered_streams_are_clean(sync):
    s = torch.neuron.Stream()
    default = torch.neuron.current_stream()

    def order(waiter, producer):
        """Orders work queued later on `waiter` after what `producer` queued so far."""
        if sync == "event":
            e = torch.neuron.Event()
            e.record(producer)
            waiter.wait_event(e)
        elif sync == "wait_stream":
            waiter.wait_stream(producer)
        elif sync == "stream_synchronize":
            producer.synchronize()
        elif sync == "device_synchronize":
            torch.neuron.synchronize()
        elif sync == "event_synchronize":
            producer.record_event().synchronize()
        elif sync == "accelerator_synchronize":
            torch.accelerator.synchronize()
        else:  # a value read waits for the stream it runs on
            with torch.neuron.stream(producer):
                probe.sum().item()

    def program():
        global probe
        probe = torch.zeros(1, device="neuron")
        a = torch.ones(N, device="neuron")
        order(s, default)
        with torch.neuron.stream(s):
            b = a * 2                           # read a on s, after its write
            b.add_(1)
        order(default, s)
        c = b + a                               # read b on the default stream, after s wrote it
        a.mul_(3)                               # write a after s read it
        return c

    clean(program)


def test_race_through_a_view_and_disjoint_slices():
    s = torch.neuron.Stream()
    x = torch.zeros(100, device="neuron")
    torch.neuron.synchronize()

    def disjoint():
        with torch.neuron.stream(s):
            x[50:].add_(1)                      # bytes 200..400 on s
        return x[:50].sum()                     # bytes 0..200 on the default stream: no conflict

    clean(disjoint)
    torch.neuron.synchronize()

    def overlapping():
        with torch.neuron.stream(s):
            x[50:].add_(1)
        return x[40:60].sum()                   # overlaps by ten elements

    (r,) = race(overlapping).reports
    assert r.current.op == "aten::sum" and r.previous.op == "aten::add_.Tensor"
    assert tuple(r.current.shape) == (20,) and tuple(r.previous.shape) == (50,)
    assert (r.current.lo - r.storage.base, r.current.hi - r.storage.base) == (160, 240)


@pytest.mark.differs_under("memcheck", "the program seeds a missing record_stream, which the memory checker reports")
def test_missing_record_stream():
    s = torch.neuron.Stream()
    torch.neuron.synchronize()

    def program(record: bool):
        busy(s)
        x = torch.ones(N, device="neuron")      # allocated on the default stream
        ptr = x.data_ptr()
        s.wait_stream(torch.neuron.current_stream())
        with torch.neuron.stream(s):
            y = x * 2                           # s reads x, behind its busy work
        if record:
            x.record_stream(s)
        del x                                   # x's block returns to the default stream's pool
        z = torch.empty(N, device="neuron")
        z.fill_(5)                              # may overwrite x while s still reads it
        return y, z, ptr

    with pytest.raises(StreamRaceError) as info:
        with stream_sanitizer():
            _, z, ptr = program(record=False)
    torch.neuron.synchronize()
    (r,) = info.value.reports
    assert r.reused and r.current.op == "aten::fill_.Scalar" and r.previous.op == "aten::mul.Tensor"
    assert "record_stream" in str(info.value) and "aten::ones" in str(info.value)
    with stream_sanitizer() as san:
        y, z, ptr = program(record=True)
        assert z.data_ptr() != ptr              # the allocator kept the recorded block back
    torch.neuron.synchronize()
    assert san.reports == []


def test_reuse_after_waiting_for_the_other_stream_is_clean():
    s = torch.neuron.Stream()

    def program():
        x = torch.ones(N, device="neuron")
        s.wait_stream(torch.neuron.current_stream())
        with torch.neuron.stream(s):
            y = x * 2
        del x
        torch.neuron.current_stream().wait_stream(s)
        return y, torch.empty(N, device="neuron").fill_(5)

    clean(program)


@pytest.mark.skipif(torch.neuron.device_count() < 2, reason="needs two neuron devices")
def test_copy_between_devices_orders_both_streams():
    """The copy waits for the source's stream and the source's stream for the copy (copy.cpp), so the
    source freed and its memory reused on its device at once is clean; reading the copy on another
    stream of the destination is not."""
    s1 = torch.neuron.Stream(device="neuron:1")

    def program(read_on_side: bool):
        a = torch.ones(N, device="neuron:0")
        b, ptr = a.to("neuron:1"), a.data_ptr()
        del a
        z = torch.full((N,), 5.0, device="neuron:0")      # a's block, on neuron:0's stream
        assert z.data_ptr() == ptr
        if not read_on_side:
            return b, z
        with torch.neuron.stream(s1):
            return b + 1, z

    clean(lambda: program(False))
    (r,) = race(lambda: program(True)).reports
    assert r.current.op == "aten::add.Tensor" and r.previous.op == "aten::_to_copy"


def test_lean_path_and_fused_chains_are_seen():
    """Small element-wise calls take the lean path (test_two_streams_without_an_event
    is one); element-wise work queued behind busy work fuses: both are
    operators the dispatch mode sees one by one."""
    s = torch.neuron.Stream()
    n = 1 << 15

    def program():
        a = torch.ones(n, device="neuron")
        busy(s)
        with torch.neuron.stream(s):
            out = ((a * 2) + 1).relu()          # element-wise work queued behind busy work: fused
        return a, out                           # a lives on while s reads it (no record_stream needed)

    with FusableFrom(n):
        kept = program()  # the first call of each signature runs on its own
        torch.neuron.synchronize()
        torchneuron.clear_op_tracking()
        with pytest.warns(StreamRaceWarning):
            with stream_sanitizer(on_race="warn") as san:  # the chain goes on after the report
                kept = program()
        torch.neuron.synchronize()
        del kept
        assert torchneuron._C._fused_groups() >= 1
        (r,) = san.reports
    assert r.current.op == "aten::mul.Tensor" and r.previous.op == "aten::ones"


def test_warn_mode_and_reports():
    s = torch.neuron.Stream()
    with pytest.warns(StreamRaceWarning, match="possible data race"):
        with stream_sanitizer(on_race="warn") as san:
            a = torch.ones(N, device="neuron")
            with torch.neuron.stream(s):
                a.sum()
    torch.neuron.synchronize()
    assert len(san.reports) == 1
    with pytest.raises(ValueError, match="on_race"):
        with stream_sanitizer(on_race="ignore"):
            pass


def test_compiled_kernels_are_seen():
    s = torch.neuron.Stream()

    @torch.compile(backend="neuron")
    def f(a):
        return (a.sin() + 1) * a

    a = torch.ones(N, device="neuron")
    f(a)  # compiled outside the sanitizer
    torch.neuron.synchronize()

    def racy():
        a.add_(1)
        with torch.neuron.stream(s):
            return f(a)

    (r,) = race(racy).reports
    assert r.current.op.startswith("compiled::cpp_fused") and not r.current.write
    assert r.previous.op == "aten::add_.Tensor"

    def ordered():
        a.add_(1)
        s.wait_stream(torch.neuron.current_stream())
        with torch.neuron.stream(s):
            out = f(a)
        torch.neuron.current_stream().wait_stream(s)
        out.record_stream(torch.neuron.current_stream())  # made on s, freed after the default stream reads it
        return out + a

    clean(ordered)


def test_nki_kernels_are_seen():
    import torchneuron.nki as nki
    import torchneuron.nki.language as nl

    @nki.jit
    def double(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(x) * 2)
        return out

    s = torch.neuron.Stream()
    x = torch.ones(128, 64, device="neuron")
    double(x)
    torch.neuron.synchronize()

    def racy():
        x.add_(1)
        with torch.neuron.stream(s):
            return double(x)

    (r,) = race(racy).reports
    assert r.current.op == "nki::double" and r.previous.op == "aten::add_.Tensor"


def test_demo_training_step_is_clean():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples"))
    import gpt_model as gm

    cfg = gm.GPTConfig(n_layer=2, d_model=64)
    model = gm.GPT(cfg, generator=torch.Generator().manual_seed(0)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(cfg.vocab_size, (4, cfg.block_size), generator=g)
    y = torch.randint(cfg.vocab_size, (4, cfg.block_size), generator=g)

    def steps():
        for _ in range(2):
            _, loss = model(x.to("neuron"), y.to("neuron"))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
            loss.item()

    san = clean(steps)
    assert san.seq > 100  # it did see the step's operators


def test_environment_variable(monkeypatch):
    program = textwrap.dedent("""
        import torch
        s = torch.neuron.Stream()
        a = torch.ones(16, device="neuron")
        with torch.neuron.stream(s):
            a.sum()
        print("not reached")
    """)
    env = dict(os.environ, TORCHNEURON_STREAM_SANITIZER="1")
    p = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "StreamRaceError" in p.stderr and "not reached" not in p.stdout
    monkeypatch.setenv("TORCHNEURON_STREAM_SANITIZER", "warn")
    sanitizer._enable_from_environment()
    try:
        assert sanitizer.active().on_race == "warn"
    finally:
        sanitizer.disable()
    assert sanitizer.active() is None


def in_threads(*targets):
    import threading

    pool = [threading.Thread(target=t) for t in targets]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def test_threads_started_while_it_is_on_are_watched():
    """A race between two threads that never enabled it, each on a stream of its own: found, with both
    accesses; two threads on one stream are ordered by it and clean."""
    import threading

    a = torch.ones(N, device="neuron")
    torch.neuron.synchronize()
    written, errors = threading.Event(), []

    def writer():
        with torch.neuron.stream(torch.neuron.Stream()):
            a.mul_(2)
        written.set()

    def reader():
        written.wait()
        with torch.neuron.stream(torch.neuron.Stream()):
            try:
                a + 1
            except StreamRaceError as e:
                errors.append(e)

    with stream_sanitizer() as san:
        in_threads(writer, reader)
    torch.neuron.synchronize()
    assert len(errors) == 1 and len(san.reports) == 1
    (r,) = san.reports
    assert r.current.op == "aten::add.Tensor" and r.previous.op == "aten::mul_.Tensor" and r.previous.write

    def on_default_stream():
        for _ in range(50):
            a.mul_(1.0)
            (a + 1).sum()

    clean(lambda: in_threads(on_default_stream, on_default_stream))


def test_a_threads_mode_goes_with_the_thread_or_the_sanitizer():
    """A thread started under the sanitizer and still running after it stops sees no more of it; its
    mode leaves when the thread ends (test_threads.py's children exit cleanly under it: a mode left on
    a thread aborts the exiting interpreter)."""
    import threading

    go, done = threading.Event(), threading.Event()

    def late():
        go.wait()
        s = torch.neuron.Stream()
        b = torch.ones(N, device="neuron")
        with torch.neuron.stream(s):
            b + 1  # a race, but the sanitizer is off by now
        done.set()

    with stream_sanitizer() as san:
        t = threading.Thread(target=late)
        t.start()
    go.set()
    t.join()
    assert done.is_set() and san.reports == []
    assert torch._C._len_torch_dispatch_stack() == 0


# Test files run again under the whole-program sanitizer (the whole suite under it is docs/sanitizers.md's
# command): nested tensors, streams and copies between devices, and the profiler's programs on a side stream.
CLEAN_FILES = ["tests/test_nested.py", "tests/test_guard_and_streams.py", "tests/test_profiler.py"]


@pytest.mark.parametrize("path", CLEAN_FILES)
def test_test_files_run_clean_under_it(path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TORCHNEURON_MEMCHECK"}  # this sanitizer alone
    env |= {"TORCHNEURON_STREAM_SANITIZER": "1", "PYTHONWARNINGS": "ignore"}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path], cwd=root, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]


def test_efficient_zero_tensors_are_read_as_zeros():
    """sgn's gradient is an efficient zero tensor, without storage; under a Python dispatch mode PyTorch
    passes it to kernels that read its null data. The sanitizer hands them real zeros."""
    x = torch.randn(5, 5, requires_grad=True)
    (g,) = torch.autograd.grad((x.sgn() * torch.rand(5, 5)).sum(), x)
    assert g._is_zerotensor()
    with stream_sanitizer():
        torch.testing.assert_close(torch.zeros(5, 5), g.detach())
        assert torch.equal(torch.ops.aten.mul.Scalar(g, 2.0), torch.zeros(5, 5))


def test_zero_tensor_crash_under_a_dispatch_mode_is_still_upstream():
    """The crash the sanitizer works around (_materialize_zero_tensors): when this fails, PyTorch handles
    zero tensors under a mode and the workaround can go."""
    program = textwrap.dedent("""
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))
        with Mode():
            torch.ops.aten.mul.Scalar(torch._efficientzerotensor(5), 2.0)
    """)
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    p = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == -11, (p.returncode, p.stderr[-2000:])


def test_tensors_without_elements_are_no_accesses():
    def program():
        e = torch.empty(0, device="neuron")
        e.cpu()                                 # a copy to the host that touches no memory
        with torch.neuron.stream(torch.neuron.Stream()):
            return (e + 1).sum().item()

    clean(program)


def test_factory_results_are_written():
    s = torch.neuron.Stream()
    a = torch.ones(N, device="neuron")
    torch.neuron.synchronize()

    def program():
        z = torch.zeros_like(a)                 # reads nothing of a, writes z on the default stream
        with torch.neuron.stream(s):
            a.sum()                             # a: no conflict
            return z.sum()                      # z: nothing orders its fill before this read

    (r,) = race(program).reports
    assert r.previous.op == "aten::zeros_like" and r.previous.write and r.current.op == "aten::sum"


@pytest.fixture
def one_rank_group():
    """A one-rank group of the neuron backend in this process: its collectives
    run on the backend's communication stream as on any number of ranks."""
    import torch.distributed as dist
    assert not dist.is_initialized()
    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


def test_collective_read_before_its_wait_is_a_race(one_rank_group):
    dist = one_rank_group
    t = torch.ones(N, device="neuron")

    def program():
        dist.all_reduce(t, async_op=True)   # written on the communication stream
        return t * 2                        # read on the default stream, not waited for

    (r,) = race(program).reports
    assert r.current.op == "aten::mul.Tensor" and not r.current.write
    assert r.previous.op == "c10d::allreduce_" and r.previous.write and r.previous.names == ["tensors"]
    assert r.previous.stream != r.current.stream


def test_collective_input_written_before_its_wait_is_a_race(one_rank_group):
    dist = one_rank_group
    t = torch.ones(N, device="neuron")
    out = [torch.empty(N, device="neuron")]

    def program():
        dist.all_gather(out, t, async_op=True)   # reads t on the communication stream
        t.add_(1)                                # writes it on the default stream meanwhile

    (r,) = race(program).reports
    assert r.current.op == "aten::add_.Tensor" and r.current.write
    assert r.previous.op == "c10d::allgather_" and not r.previous.write and r.previous.names == ["input_tensors"]


@pytest.mark.parametrize("program", ["sync", "async_wait", "all_gather_reads", "reduce_scatter_tensor",
                                     "functional", "broadcast_on_side_stream"])
def test_collectives_ordered_by_their_waits_are_clean(one_rank_group, program):
    dist = one_rank_group
    from torch.distributed import _functional_collectives as funcol

    def run():
        t = torch.arange(2 * N, dtype=torch.float32, device="neuron")
        if program == "sync":
            dist.all_reduce(t)
            return t * 2
        if program == "async_wait":
            dist.all_reduce(t, async_op=True).wait()
            return t * 2
        if program == "all_gather_reads":  # reading an input while the collective also reads it
            out = [torch.empty_like(t)]
            work = dist.all_gather(out, t, async_op=True)
            u = t + 1
            work.wait()
            return out[0] * u
        if program == "reduce_scatter_tensor":
            out = torch.empty_like(t)
            dist.reduce_scatter_tensor(out, t)
            return out + t
        if program == "functional":  # as DTensor calls them
            return funcol.wait_tensor(funcol.all_reduce(t, "sum", dist.group.WORLD)) * 2
        side = torch.neuron.Stream()  # as FSDP2 issues its collectives
        side.wait_stream(torch.neuron.current_stream())
        with torch.neuron.stream(side):
            dist.broadcast(t, src=0)
        torch.neuron.current_stream().wait_stream(side)
        t.record_stream(side)
        return t * 2

    cpu = torch.arange(2 * N, dtype=torch.float32)
    expected = {"sync": cpu * 2, "async_wait": cpu * 2, "all_gather_reads": cpu * (cpu + 1),
                "reduce_scatter_tensor": cpu * 2, "functional": cpu * 2, "broadcast_on_side_stream": cpu * 2}
    with stream_sanitizer() as san:
        y = run()
    assert san.reports == [], "\n".join(str(r) for r in san.reports)
    assert torch.equal(y.cpu(), expected[program])
