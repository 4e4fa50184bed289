"""The device memory checker (TORCHNEURON_MEMCHECK, docs/sanitizers.md): seeded
bugs each caught with the right report, correct programs with none. The
checker is switched on when the library loads and a host access faults, so
the cases run in child processes: the seeded bugs one after another in one
child (warn mode), the raised exception and the correct program in their own."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PRELUDE = """
import ctypes, json, sys
import numpy as np
import torch, torchneuron
import torchneuron.memcheck as mc
def done(**extra):
    torch.neuron.synchronize()
    sum(range(10))  # a few bytecodes: a pending report is delivered between them
    print(json.dumps({"reports": [[r.kind, str(r)] for r in mc.reports()], "stats": mc.stats(),
                      "protecting": mc.protecting(), **extra}))
"""


def memcheck_env(mode: str, **extra) -> dict:
    """The environment of a child that runs the memory checker alone: under the whole suite's stream
    sanitizer, the seeded bugs would be reported by that sanitizer first."""
    env = {k: v for k, v in os.environ.items() if k != "TORCHNEURON_STREAM_SANITIZER"}
    return env | {"TORCHNEURON_MEMCHECK": mode, "PYTHONWARNINGS": "ignore", **extra}


def run_child(body: str, mode: str = "warn") -> dict:
    with tempfile.NamedTemporaryFile("w", suffix="_memcheck_case.py", delete=False) as f:
        f.write(PRELUDE + textwrap.dedent(body))  # a file, so that reports show source lines
    env = memcheck_env(mode, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    try:
        p = subprocess.run([sys.executable, f.name], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    finally:
        os.unlink(f.name)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def needs_protection(out: dict) -> None:
    if not out["protecting"]:
        pytest.skip("host access protection is off: no memory protection keys (see the child's warning)")


def test_host_read_through_raw_pointer_raises_naming_the_block_and_the_line():
    out = run_child("""
        caught = []
        x = torch.arange(1000., device="neuron")
        torch.neuron.synchronize()
        try:
            value = ctypes.c_float.from_address(x.data_ptr() + 8).value
            sum(range(10))
        except mc.MemcheckError as e:
            caught.append(str(e))
        done(caught=caught, value=value)
    """, mode="1")
    needs_protection(out)
    assert len(out["caught"]) == 1, out
    msg = out["caught"][0]
    assert "host access: host code read device memory" in msg
    assert "byte 8 of the block" in msg and "(a (1000,) float32 tensor, 4000 bytes requested" in msg
    assert "_ctypes" in msg  # the faulting instruction's library
    # the Python code running when it is delivered: the access's line or the next
    assert "value = ctypes.c_float.from_address" in msg or "sum(range(10))" in msg, msg
    assert "The block was allocated at" in msg and 'x = torch.arange(1000., device="neuron")' in msg
    assert out["value"] == 2.0  # the access completed: no crash


MISSING_RECORD_STREAM = """
    s1 = torch.neuron.Stream()
    a = torch.randn(768, 768, device="neuron")
    x = torch.ones(1 << 16, device="neuron")
    torch.neuron.synchronize()
    with torch.neuron.stream(s1):
        for _ in range(6):
            a = a @ a / 768      # keeps s1 busy
        y = x.view(256, 256) @ x.view(256, 256)   # queued on s1 behind it
    RECORD
    del x                        # freed on the default stream's pool
    z = torch.full((1 << 16,), 5.0, device="neuron")
"""

SEEDED = {  # in this order: the write after free needs the fresh allocator's best fit to reuse its block
    "write_after_free": """
        x = torch.ones(1024, device="neuron")
        ptr = x.data_ptr()
        torch.neuron.synchronize()
        del x
        ctypes.c_float.from_address(ptr + 40).value = 7.0   # after the free
        y = torch.empty(1024, device="neuron")              # the same block again
        extra["same"] = y.data_ptr() == ptr
    """,
    "numpy_alias": """
        x = torch.ones(4096, device="neuron")
        torch.neuron.synchronize()
        alias = torch.from_numpy(np.ctypeslib.as_array(ctypes.cast(x.data_ptr(), ctypes.POINTER(ctypes.c_float)),
                                                       shape=(4096,)))
        total = float(alias.numpy().sum())
        extra["total"] = total
    """,
    # The NKI emulator bounds-checks every access a kernel makes
    # (NKIOutOfBoundsError), so an NKI kernel cannot overrun; this seeds the
    # overrun in the task machinery NKI kernels run on (torchneuron/_python_tasks.py).
    "task_overrun": """
        from torchneuron._python_tasks import launch
        y = torch.zeros(100, device="neuron")
        def overrun(hosts):
            np.ctypeslib.as_array((ctypes.c_float * 104).from_address(hosts[0].data_ptr()))[:] = 1.0
        launch("nki::overrun", [y], overrun)
        extra["head"] = y[:100].sum().item()
    """,
    # A C++ kernel registered for PrivateUse1 that runs as a device task
    # (through the launcher compiled kernels use).
    "extension_overrun": """
        if LIB:
            fn = ctypes.cast(ctypes.CDLL(LIB).overrun_fill, ctypes.c_void_p).value
            lib = torch.library.Library("memcheck_ext", "DEF")
            lib.define("fill(Tensor(a!) t) -> ()")
            def fill(t):
                torchneuron._C._launch_cpp_kernel(fn, "memcheck_ext::fill", t.device.index,
                                                  [t.data_ptr(), t.numel()], [], [])
            lib.impl("fill", fill, "PrivateUse1")
            t = torch.zeros(64, device="neuron")
            torch.ops.memcheck_ext.fill(t)
            extra["total"] = t.sum().item()
    """,
    "missing_record_stream": MISSING_RECORD_STREAM.replace("RECORD", ""),
}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> dict:
    """Every case of SEEDED, in order, in one child: {case: (reports, extra)}."""
    lib = ""
    if cxx := shutil.which("g++") or shutil.which("c++"):
        d = tmp_path_factory.mktemp("ext")
        (d / "overrun.cpp").write_text('#include <cstdint>\nextern "C" void overrun_fill(float* p, int64_t n) '
                                       '{ for (int64_t i = 0; i <= n; ++i) p[i] = 2.0f; }\n')
        subprocess.run([cxx, "-O1", "-shared", "-fPIC", str(d / "overrun.cpp"), "-o", str(d / "liboverrun.so")],
                       check=True, timeout=60)
        lib = str(d / "liboverrun.so")
    body = [f"LIB = {lib!r}", "cases = {}"]
    for name, code in SEEDED.items():
        body += ["extra = {}; before = len(mc.reports())", textwrap.dedent(code),
                 "torch.neuron.synchronize(); sum(range(10))",
                 f"cases[{name!r}] = ([[r.kind, str(r)] for r in mc.reports()[before:]], extra)"]
    body.append("done(cases=cases)")
    out = run_child("\n".join(body))
    out["lib"] = lib
    return out


def case(seeded, name):
    reports, extra = seeded["cases"][name]
    return [k for k, _ in reports], [m for _, m in reports], extra


def test_host_read_through_numpy_of_an_alias_is_reported(seeded):
    needs_protection(seeded)
    kinds, msgs, extra = case(seeded, "numpy_alias")
    assert kinds == ["host access"], msgs
    assert "(a (4096,) float32 tensor, 16384 bytes requested" in msgs[0] and "total = float(alias.numpy().sum())" in msgs[0]
    assert extra["total"] == 4096.0


def test_write_after_free_is_found_when_the_memory_is_handed_out_again(seeded):
    kinds, msgs, extra = case(seeded, "write_after_free")
    assert extra["same"], msgs
    assert kinds == (["host access"] if seeded["protecting"] else []) + ["write after free"], msgs
    waf = msgs[-1]
    assert "holds 0x00 instead of the poison 0xfb" in waf  # 7.0f's low byte
    assert "it belonged to a block of 4096 bytes" in waf and "(a (1024,) float32 tensor" in waf
    assert "That block was allocated at" in waf and "x = torch.ones(1024" in waf
    assert "and freed at" in waf and "del x" in waf


def test_out_of_bounds_write_by_a_device_task_names_the_kernel(seeded):
    kinds, msgs, extra = case(seeded, "task_overrun")
    assert kinds == ["out of bounds"], msgs
    assert "task nki::overrun on neuron:0 stream 0 wrote past the end" in msgs[0] and "(a (100,) float32 tensor, 400 bytes requested" in msgs[0]
    assert "byte 400 of the block (0 past the requested bytes)" in msgs[0]
    assert extra["head"] == 100.0


def test_out_of_bounds_write_by_an_extension_kernel_names_it(seeded):
    if not seeded["lib"]:
        pytest.skip("no C++ compiler")
    kinds, msgs, extra = case(seeded, "extension_overrun")
    assert kinds == ["out of bounds"], msgs
    assert "task memcheck_ext::fill" in msgs[0] and "(a (64,) float32 tensor, 256 bytes requested" in msgs[0]
    assert extra["total"] == 128.0


def test_missing_record_stream_names_the_task_and_the_free(seeded):
    kinds, msgs, _ = case(seeded, "missing_record_stream")
    assert kinds == ["missing record_stream"], msgs
    msg = msgs[0]
    assert "task aten::mm on neuron:0 stream 1" in msg and "record_stream" in msg, msg
    assert "del x" in msg, msg  # the free
    assert "a (65536,) float32 tensor" in msg, msg  # x, the freed block
    if "handed out again" in msg:  # reused before the task ran: the new owner too
        assert "z = torch.full" in msg, msg


def test_correct_programs_report_nothing():
    out = run_child(MISSING_RECORD_STREAM.replace("RECORD", "x.record_stream(s1)") + """
    # a small training loop (fused, lean path, optimizer), host reads of results, an event between streams
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(5):
        xb = torch.randn(16, 32, device="neuron")
        loss = model(xb).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
    host = model[0].weight.detach().cpu().numpy()
    ev = torch.neuron.Event()
    with torch.neuron.stream(s1):
        w = model[0].weight.detach() * 3
        ev.record()
    torch.neuron.current_stream().wait_event(ev)
    w.add_(1)
    done(finite=bool(np.isfinite(host).all()))
    """, mode="1")
    assert out["reports"] == [], out
    assert out["finite"]
    assert out["stats"]["checked"] > 0 and out["stats"]["poisoned"] > 0 and out["stats"]["canary_checks"] > 0


REUSE_ON_THE_SIDE_STREAM = """
    s1 = torch.neuron.Stream()
    a = torch.randn(768, 768, device="neuron")
    with torch.neuron.stream(s1):
        x = torch.ones(1 << 16, device="neuron")          # s1's block
    torch.neuron.current_stream().wait_stream(s1)
    for _ in range(6):
        a = a @ a / 768                                   # keeps the default stream busy
    y = x.view(256, 256) @ x.view(256, 256)               # read on the default stream, queued behind it
    del x                                                 # back in s1's pool while the read waits
    ORDER
    with torch.neuron.stream(s1):
        z = torch.full((1 << 16,), 5.0, device="neuron")  # x's memory again
    done(y=y.sum().item())
"""
ORDERS = {"wait_stream": "s1.wait_stream(torch.neuron.current_stream())",
          "event": "e = torch.neuron.Event(); e.record(); s1.wait_event(e)",
          "synchronize": "torch.neuron.synchronize()"}


@pytest.mark.parametrize("order", ORDERS)
def test_reuse_ordered_after_the_other_streams_use_is_clean(order):
    """As FSDP2's reduce-scatter buffers: freed without record_stream, their
    stream waits for the stream that read them before it allocates again."""
    out = run_child(REUSE_ON_THE_SIDE_STREAM.replace("ORDER", ORDERS[order]))
    assert out["reports"] == [], out
    assert out["y"] == 256.0 * (1 << 16)


def test_unordered_reuse_is_a_missing_record_stream():
    out = run_child(REUSE_ON_THE_SIDE_STREAM.replace("ORDER", ""))
    kinds, msgs = [k for k, _ in out["reports"]], [m for _, m in out["reports"]]
    assert kinds == ["missing record_stream"], msgs
    assert "task aten::mm on neuron:0 stream 0" in msgs[0] and "handed out again on neuron:0 stream 1" in msgs[0]
    assert "del x" in msgs[0] and "z = torch.full" in msgs[0], msgs[0]


# A first call of a call signature runs on the host, after its stream went
# idle; the signature's later calls queue. Its use of another stream's memory
# counts as that stream's work, so a missing record_stream shows at the first
# iteration. s1 is kept busy so that once warm the use also runs after the
# free (which the checker sees as it would without first calls counted).
FIRST_ITERATION = """
    s1 = torch.neuron.Stream()
    a = torch.randn(768, 768, device="neuron")
    for i in range(3):
        x = torch.ones(1 << 16, device="neuron")
        s1.wait_stream(torch.neuron.current_stream())
        with torch.neuron.stream(s1):
            for _ in range(4):
                a = a @ a / 768
            y = torch.erfc(x)                              # the signature's first call at i == 0
        del x                                              # no record_stream(s1)
        z = torch.full((1 << 16,), 5.0, device="neuron")  # x's memory again, on the default stream
        torch.neuron.synchronize(); sum(range(10))
        if "first" not in extra and len(mc.reports()) > before:
            extra["first"] = i
"""

# x (the default stream's) is used on s1, freed without record_stream and its
# memory reused on the default stream; the only order between the use and the
# reuse goes through a third stream s2 (s2 waits for s1, then the default
# stream, or the host, waits for s2). USE: a task queued on s1 behind busy
# work (it runs after the free), or a signature's first call. WAIT: the last
# link of the chain, left out in the case without the order.
THROUGH_S2 = """
    s1, s2 = torch.neuron.Stream(), torch.neuron.Stream()
    a = torch.randn(768, 768, device="neuron")
    x = torch.ones(1 << 16, device="neuron")
    ptr = x.data_ptr()
    s1.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(s1):
        USE
    del x
    s2.wait_stream(s1)
    WAIT
    z = torch.full((1 << 16,), 5.0, device="neuron")
    extra["same"], extra["s1"] = z.data_ptr() == ptr, s1.stream_id
    keep.append((y, z))
"""
USES = {"queued": "for _ in range(6): a = a @ a / 768\n        y = x.view(256, 256) @ x.view(256, 256)",
        "first call": "y = torch.OP(x)"}
WAITS = {"device": "torch.neuron.current_stream().wait_stream(s2)",
         "host": "e = s2.record_event(); e.synchronize()"}
FIRST_CALL_OPS = iter(["expm1", "log1p", "sinh", "cosh"])  # a fresh signature per case
THROUGH_CASES = {}
for use in USES:
    for wait in WAITS:
        for ordered in (True, False):
            code = THROUGH_S2.replace("USE", USES[use]).replace("WAIT", WAITS[wait] if ordered else "")
            THROUGH_CASES[f"{use} {wait} {ordered}"] = code.replace("OP", next(FIRST_CALL_OPS) if use == "first call" else "")


@pytest.fixture(scope="module")
def orders() -> dict:
    """FIRST_ITERATION and every THROUGH_CASES case, in one child: {case: (reports, extra)}.
    A synchronisation between cases orders what one left behind before the next."""
    cases = {"first iteration": FIRST_ITERATION} | THROUGH_CASES
    body = ["cases = {}; keep = []"]
    for name, code in cases.items():
        body += ["extra = {}; before = len(mc.reports())", textwrap.dedent(code),
                 "torch.neuron.synchronize(); sum(range(10))",
                 f"cases[{name!r}] = ([[r.kind, str(r)] for r in mc.reports()[before:]], extra)"]
    body.append("done(cases=cases)")
    return run_child("\n".join(body))["cases"]


def test_missing_record_stream_is_caught_at_the_first_iteration(orders):
    reports, extra = orders["first iteration"]
    assert extra.get("first") == 0, reports
    msg = reports[0][1]
    assert reports[0][0] == "missing record_stream"
    assert "the first call of aten::erfc on neuron:0 stream 1" in msg and "later calls queue" in msg, msg
    assert "del x" in msg and "z = torch.full" in msg, msg


@pytest.mark.parametrize("wait", WAITS)
@pytest.mark.parametrize("use", USES)
def test_reuse_ordered_through_a_third_stream(orders, use, wait):
    """The same program with and without the chain's last wait: with it, the
    reuse follows s1's use through s2 (clean); without, a missing record_stream."""
    ordered, extra = orders[f"{use} {wait} True"]
    unordered, extra_unordered = orders[f"{use} {wait} False"]
    assert extra["same"] and extra_unordered["same"]  # the reuse happened in both
    assert ordered == [], ordered
    assert [k for k, _ in unordered] == ["missing record_stream"], unordered
    named = "task aten::mm" if use == "queued" else "the first call of aten::"
    msg = unordered[0][1]
    assert named in msg and f" on neuron:0 stream {extra_unordered['s1']} " in msg, msg


# x (the default stream's) is used on s1 behind busy work (so after its free)
# without record_stream, and its memory reused on the default stream; the
# only order between the use and the reuse goes through a collective: queued
# from s1, it runs after s1's work on the communication stream, and WAIT is
# the default stream's or the host's wait for it. Left out, the reuse is a
# missing record_stream.
THROUGH_A_COLLECTIVE = """
s1 = torch.neuron.Stream()
a = torch.randn(768, 768, device="neuron")
w = torch.ones(1024, device="neuron")
x = torch.ones(1 << 16, device="neuron")
ptr = x.data_ptr()
s1.wait_stream(torch.neuron.current_stream())
with torch.neuron.stream(s1):
    for _ in range(6):
        a = a @ a / 768
    y = x.view(256, 256) @ x.view(256, 256)
    work = dist.all_reduce(w, async_op=True)
del x
WAIT
z = torch.full((1 << 16,), 5.0, device="neuron")
extra["same"], extra["s1"], extra["device"] = z.data_ptr() == ptr, s1.stream_id, z.device.index
keep.append((y, z, work))
"""
WORK_WAITS = {"stream": "work.wait()",  # the default stream waits; gloo's thread ends its wait
              "host": "work.wait(datetime.timedelta(seconds=60))",  # with a timeout: on the host
              "done": "while not work.is_completed(): time.sleep(0.001)\nwork.wait()",  # over at once
              "none": ""}


def _work_wait_cases(directory):
    """THROUGH_A_COLLECTIVE with each of WORK_WAITS, from a file (reports show its lines): {wait: (reports, extra)}."""
    import datetime
    import time
    import torch.distributed as dist
    import torchneuron.memcheck as mc

    cases, keep = {}, []
    for name, wait in WORK_WAITS.items():
        path = os.path.join(directory, f"work_wait_{name.replace(' ', '_')}_{dist.get_rank()}.py")
        with open(path, "w") as f:
            f.write(THROUGH_A_COLLECTIVE.replace("WAIT", wait))
        extra, before = {}, len(mc.reports())
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), {"torch": torch, "dist": dist, "datetime": datetime, "time": time,
                                                   "extra": extra, "keep": keep})
        torch.neuron.synchronize()
        dist.barrier()
        cases[name] = ([[r.kind, str(r)] for r in mc.reports()[before:]], extra)
    return cases


def _ranks_under_the_checker(rank, world, port, directory):
    """FSDP2 training (an MLP, the demo's GPT) and a torch.distributed.checkpoint
    round trip on a rank under the checker, as test_distributed_parallel's
    worker begins (its meshes first: in the allocator state they leave, the
    GPT's steps reuse the all-gather copy-in's memory). FSDP2 orders that
    reuse only through a third stream (copy-in stream, all-gather stream,
    default stream), and the copy-in's first call counts as its stream's work.
    Then the orders through a collective's Work.wait() (_work_wait_cases), in
    the same ranks: a spawn is the cost."""
    import torch.distributed as dist
    import torchneuron.memcheck as mc
    from test_distributed_parallel import _checkpoint, _mesh_facts, _train_gpt, _train_mlp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.neuron.set_device(rank)
    dist.init_process_group("cpu:gloo,neuron:neuron", rank=rank, world_size=world)
    try:
        _mesh_facts(world)
        losses, _ = _train_mlp("neuron", "fsdp", rank, world)
        losses += _train_gpt("neuron", "fsdp", rank, world)[0]
        _checkpoint(rank, world, directory)
        torch.neuron.synchronize()
        fsdp_reports = [str(r) for r in mc.reports()]
        return {"reports": fsdp_reports, "losses": losses, "work_waits": _work_wait_cases(directory)}
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    from distributed_testing import spawn_ranks

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("TORCHNEURON_STREAM_SANITIZER", raising=False)
        mp.setenv("TORCHNEURON_MEMCHECK", "warn")  # read by each rank's torchneuron at load
        return spawn_ranks(_ranks_under_the_checker, 2, str(tmp_path_factory.mktemp("ranks")))


def test_fsdp2_and_distributed_checkpoint_are_clean(ranks):
    for r in ranks.values():
        assert r["reports"] == [], r["reports"]
        assert len(r["losses"]) > 1


@pytest.mark.parametrize("wait", [w for w in WORK_WAITS if w != "none"])
def test_reuse_ordered_through_a_collectives_wait(ranks, wait):
    """The same program with and without the wait for the collective: with it,
    the reuse follows s1's use through the collective (clean); without, a
    missing record_stream, reported at the reuse."""
    for r in ranks.values():
        ordered, extra = r["work_waits"][wait]
        unordered, extra_unordered = r["work_waits"]["none"]
        assert extra["same"] and extra_unordered["same"]  # the reuse happened in both
        assert ordered == [], ordered
        assert [k for k, _ in unordered] == ["missing record_stream"], unordered
        msg = unordered[0][1]
        assert f"task aten::mm on neuron:{extra_unordered['device']} stream {extra_unordered['s1']} " in msg, msg
        assert "del x" in msg and "z = torch.full" in msg, msg


# Test files whose programs run clean under the checker, run again under it
# here (the whole suite under it is docs/sanitizers.md's command). Their
# host-side copies into device memory race with the device going idle: the
# checks owed to the idle stream must run before the host writes.
CLEAN_FILES = ["tests/test_recurrent.py", "tests/test_sanitizer.py"]


@pytest.mark.parametrize("path", CLEAN_FILES)
def test_test_files_run_clean_under_the_checker(path):
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path], cwd=ROOT,
                       env=memcheck_env("1"),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]


MEMORY_FIGURES = """
sizes = (1, 100, 4096, 1 << 20, 3 << 20)
torch.neuron.synchronize()
base = torch.neuron.memory_allocated()
xs = [torch.empty(n, device="neuron") for n in sizes]
figures = [torch.neuron.memory_allocated() - base]
del xs
torch.neuron.synchronize()
figures.append(torch.neuron.memory_allocated() - base)
"""


def test_memory_figures_are_those_of_an_unchecked_run():
    """The checker's redzones are not counted: a program reads the allocated bytes it reads
    unchecked (what memory-accounting code asserts)."""
    checked = run_child(MEMORY_FIGURES + "done(figures=figures)")["figures"]
    unchecked = {}
    exec(MEMORY_FIGURES, {"torch": torch}, unchecked)
    assert checked == unchecked["figures"] and checked[0] > 0 and checked[1] == 0
