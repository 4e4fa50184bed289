"""Error semantics as on the CPU and CUDA: errors a kernel finds without
looking at the data are raised at the call with the CPU's exception; errors
found on the device are sticky, all kept, raised by every synchronising call
of any stream with the kernel's exception type, and never lost at exit;
Ctrl-C interrupts a waiting host at once, and exit with queued work is
bounded."""
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from neuron_testing import ROOT, run_python


def _outcome(fn, device):
    """What a call does on `device`, right at the call: its exception's type
    and message (first line), or "ok"."""
    try:
        fn(device)
    except Exception as e:  # noqa: BLE001  (the type is what is compared)
        return type(e).__name__, str(e).splitlines()[0]
    return "ok"


def _c64(d):
    return torch.ones(4, dtype=torch.complex64, device=d)


# Checks CPU kernels make before reading any data: dtypes they are not built
# for and argument checks their meta kernels lack.
ERRORS_AT_THE_CALL = {
    "lgamma_complex": lambda d: torch.lgamma(_c64(d)),
    "relu_bool": lambda d: torch.relu(torch.ones(4, dtype=torch.bool, device=d)),
    "digamma_complex": lambda d: torch.digamma(_c64(d)),
    "sort_complex": lambda d: torch.sort(_c64(d)),
    "cummax_complex": lambda d: torch.cummax(_c64(d), 0),
    "fmod_complex": lambda d: torch.fmod(_c64(d), 2),
    "gcd_float": lambda d: torch.gcd(torch.ones(4, device=d), torch.ones(4, device=d)),
    "atan2_complex": lambda d: torch.atan2(_c64(d), _c64(d)),
    "cholesky_int": lambda d: torch.linalg.cholesky(torch.eye(3, dtype=torch.int64, device=d)),
    "histc_int": lambda d: torch.histc(torch.ones(4, dtype=torch.int64, device=d)),
    "mse_loss_int": lambda d: torch.nn.functional.mse_loss(torch.ones(4, dtype=torch.int64, device=d),
                                                          torch.ones(4, dtype=torch.int64, device=d)),
    "softmax_int": lambda d: torch.softmax(torch.ones(4, dtype=torch.int64, device=d), 0),
    "mm_bool": lambda d: torch.ones(4, 4, dtype=torch.bool, device=d) @ torch.ones(4, 4, dtype=torch.bool, device=d),
    "topk_k": lambda d: torch.topk(torch.ones(4, device=d), 7),
    "kthvalue_k": lambda d: torch.kthvalue(torch.ones(4, device=d), 9),
}


@pytest.mark.parametrize("name", ERRORS_AT_THE_CALL)
def test_errors_needing_no_data_are_raised_at_the_call_as_on_the_cpu(name):
    fn = ERRORS_AT_THE_CALL[name]
    want = _outcome(fn, "cpu")
    assert want != "ok"
    assert _outcome(fn, "neuron") == want
    assert torch.neuron.device_errors()["total"] == 0  # nothing deferred



def _floats(d):
    return [torch.ones(3, device=d), torch.ones(5, device=d)]


# A Scalar the CPU kernel refuses by its value (complex into a real tensor, a
# fraction into an integer one, a bool subtracted), after a call with the same
# tensors and an accepted value has queued: the value decides, per Scalar and
# per element of a Scalar[], so the refusal still comes at the call.
# (call, accepted value, refused value)
SCALAR_VALUES_AT_THE_CALL = {
    "foreach_sub_scalarlist_complex": (lambda d, s: torch._foreach_sub_(_floats(d), [1.0, s]), 2.0, 1j),
    "foreach_sub_scalarlist_bool": (lambda d, s: torch._foreach_sub_(_floats(d), [s, 1.0]), 2.0, True),
    "foreach_sub_scalar_complex": (lambda d, s: torch._foreach_sub_(_floats(d), s), 2.0, 1j),
    "foreach_add_scalarlist_fraction_into_int": (
        lambda d, s: torch._foreach_add_([torch.ones(3, dtype=torch.int64, device=d)], [s]), 2, 1.5),
    "foreach_lerp_scalarlist_complex": (lambda d, s: torch._foreach_lerp_(_floats(d), _floats(d), [0.5, s]), 0.25, 1j),
    "foreach_addcmul_scalarlist_complex": (
        lambda d, s: torch._foreach_addcmul_(_floats(d), _floats(d), _floats(d), [s, 0.5]), 0.25, 1j),
    "foreach_addcdiv_scalarlist_complex": (
        lambda d, s: torch._foreach_addcdiv_(_floats(d), _floats(d), _floats(d), [s, 0.5]), 0.25, 1j),
    "foreach_div_scalarlist_complex": (lambda d, s: torch._foreach_div_(_floats(d), [s, 2.0]), 4.0, 1j),
}


@pytest.mark.parametrize("name", SCALAR_VALUES_AT_THE_CALL)
def test_a_refused_scalar_value_is_raised_at_the_call_after_accepted_values_queued(name):
    fn, good, bad = SCALAR_VALUES_AT_THE_CALL[name]
    want = _outcome(lambda d: fn(d, bad), "cpu")
    assert want != "ok"
    for _ in range(2):  # the first call of a signature runs synchronously, the second queues
        fn("neuron", good)
    assert _outcome(lambda d: fn(d, bad), "neuron") == want
    torch.neuron.synchronize()
    assert torch.neuron.device_errors()["total"] == 0  # nothing deferred

# Errors only the data shows: raised at the next synchronising call, as the
# CPU kernel's exception type (CUDA raises a RuntimeError for all of them).
DATA_ERRORS = {
    "embedding": (lambda d, i: torch.nn.functional.embedding(torch.tensor([i], device=d), torch.ones(4, 2, device=d)),
                  IndexError),
    "cross_entropy": (lambda d, i: torch.nn.functional.cross_entropy(torch.ones(2, 4, device=d),
                                                                     torch.tensor([1, i], device=d)), IndexError),
    "gather": (lambda d, i: torch.gather(torch.ones(4, device=d), 0, torch.tensor([i], device=d)), RuntimeError),
}


@pytest.mark.parametrize("name", DATA_ERRORS)
def test_data_errors_keep_the_cpus_exception_type(name):
    fn, kind = DATA_ERRORS[name]
    with pytest.raises(kind) as on_cpu:
        fn("cpu", 9)
    assert type(on_cpu.value) is kind
    fn("neuron", 1)  # accepted once: later calls queue
    fn("neuron", 9)
    with pytest.raises(kind) as on_neuron:
        torch.neuron.synchronize()
    assert type(on_neuron.value) is kind
    assert str(on_cpu.value).splitlines()[0] in str(on_neuron.value)


def _queue_failure(stream=None, index=9):
    x = torch.arange(4.0, device="neuron")
    torch.index_select(x, 0, torch.tensor([1], device="neuron"))  # accepted: later calls queue
    stream = stream if stream is not None else torch.neuron.current_stream()
    stream.wait_stream(torch.neuron.current_stream())  # x is written on the current stream
    x.record_stream(stream)  # freed at the return, while `stream` may still read it
    with torch.neuron.stream(stream):
        return torch.index_select(x, 0, torch.tensor([index], device="neuron"))


def test_errors_are_sticky_until_reset():
    torch.ones(1, device="neuron") * 2  # accepted: later calls queue
    y = _queue_failure()
    z = y * 2  # computed from the failed result: never silently readable
    reads = [torch.neuron.synchronize, torch.accelerator.synchronize, lambda: z.cpu(), lambda: z.sum().item(),
             lambda: torch.neuron.current_stream().synchronize(), lambda: torch.zeros(3, device="neuron").tolist()]
    event = torch.neuron.Event()
    event.record()
    reads.append(event.synchronize)
    for read in reads:
        with pytest.raises(IndexError, match="(?s)aten::index_select.*out of range.*reset_errors"):
            read()
    errors = torch.neuron.reset_errors()
    assert len(errors) == 1 and "aten::index_select" in errors[0]
    assert torch.neuron.reset_errors() == []
    assert (torch.arange(4.0, device="neuron") + 1).sum().item() == 10  # the device works on


def test_every_failure_is_kept_and_counted():
    for index in (9, -7, 5):
        _queue_failure(index=index)
    while not torch.neuron.current_stream().query():  # waits without raising
        time.sleep(0.001)
    info = torch.neuron.device_errors()
    assert info["total"] == 3 and info["unreported"] == 3
    with pytest.raises(IndexError, match=r"stream 0; 2 later task\(s\) failed too\)"):
        torch.neuron.synchronize()
    assert torch.neuron.device_errors()["unreported"] == 0
    assert len(torch.neuron.reset_errors()) == 3


def test_an_error_on_a_side_stream_is_raised_by_device_wide_synchronisation():
    side = torch.neuron.Stream()
    _queue_failure(stream=side)
    with pytest.raises(IndexError, match="stream [1-9]"):
        torch.accelerator.synchronize()
    with pytest.raises(IndexError):
        torch.neuron.synchronize()
    torch.neuron.reset_errors()


def test_an_error_no_synchronising_call_raised_is_printed_at_exit_with_status_1():
    failing = """
import torch
x = torch.arange(4.0, device="neuron")
torch.index_select(x, 0, torch.tensor([1], device="neuron"))
torch.index_select(x, 0, torch.tensor([9], device="neuron"))
print("end of script")
"""
    r = run_python(failing)
    assert r.returncode == 1 and "end of script" in r.stdout
    assert "1 device error(s) were never raised" in r.stderr and "aten::index_select" in r.stderr
    # Once a synchronising call has raised it, the program saw it: exit as usual.
    r = run_python(failing + "try:\n    torch.neuron.synchronize()\nexcept IndexError:\n    print('seen')\n")
    assert r.returncode == 0 and "seen" in r.stdout and "never raised" not in r.stderr, r.stderr


@pytest.mark.parametrize("ending", ["", "sys.exit(0)", "sys.exit(3)", "raise SystemExit('bye')"])
def test_an_unraised_device_error_at_exit_keeps_a_failing_status_the_program_chose(ending):
    """The error is printed and a status of 0 becomes 1; any other status
    (sys.exit(3), SystemExit with a message's 1) is the one the program, run
    on the CPU without the error, ends with."""
    program = f"""
import sys, torch
x = torch.arange(4.0, device="neuron")
torch.index_select(x, 0, torch.tensor([1], device="neuron"))  # the first call of a signature runs at once
torch.index_select(x, 0, torch.tensor([9], device="neuron"))
{ending}
"""
    r = run_python(program)
    cpu = subprocess.run([sys.executable, "-c", f"import sys\n{ending}"], capture_output=True).returncode
    assert r.returncode == (cpu or 1), r.stderr
    assert "1 device error(s) were never raised" in r.stderr and "aten::index_select" in r.stderr


# A queue of work that takes many seconds: 400 matrix products of 1024x1024.
LONG_QUEUE = """
    import sys, time, torch
    a = torch.randn(1024, 1024, device="neuron")
    (a @ a).cpu()
    for _ in range(400):
        b = a @ a
    print("queued", flush=True)
"""


def _interrupt(body, env=None):
    """Runs LONG_QUEUE then `body` in a child, sends SIGINT once the child is
    inside `body`, and returns (the monotonic time SIGINT was sent, seconds
    from then to exit, returncode, stdout, stderr). CLOCK_MONOTONIC is one
    clock for every process of the machine."""
    # Python's own SIGINT handler, as a program started from a terminal has: a child of
    # a pytest started in the background (`cmd &` without job control) inherits SIG_IGN
    restore = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
    code = restore + textwrap.dedent(LONG_QUEUE) + textwrap.dedent(body)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=ROOT, env=env)
    try:
        assert child.stdout.readline() == "queued\n"
        time.sleep(0.3)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
        return sent, time.monotonic() - sent, child.returncode, out, err
    finally:
        child.kill()


@pytest.mark.parametrize("wait", ["torch.neuron.synchronize()", "b.sum().item()", "torch.accelerator.synchronize()",
                                  "torch.neuron.current_stream().synchronize()"])
def test_ctrl_c_interrupts_a_synchronising_call_within_half_a_second(wait):
    body = f"""
        try:
            {wait}
            print("not interrupted", flush=True)
        except KeyboardInterrupt:
            print("caught at", time.monotonic(), "work pending", not torch.neuron.current_stream().query(), flush=True)
        import os
        os._exit(0)
    """
    sent, _, code, out, err = _interrupt(body)
    assert "caught at" in out and "work pending True" in out, (out, err)
    assert float(out.split("caught at ")[1].split()[0]) - sent < 0.5


def test_exit_after_an_uncaught_ctrl_c_cancels_queued_work():
    # Idle in Python with about ten seconds of device work queued: the
    # uncaught KeyboardInterrupt ends the process, and the queued work that
    # no one can read any more is cancelled, not run.
    _, elapsed, code, out, err = _interrupt("time.sleep(60)\n")
    assert code == -signal.SIGINT, err
    assert elapsed < 5, elapsed


@pytest.mark.parametrize("ending", ["", "sys.exit(3)\n"])
def test_ctrl_c_during_the_exit_drain_cancels_the_queued_work_and_ends_as_interrupted(ending):
    # The program ends with about ten seconds of device work queued: the
    # exit drain waits for it, and Ctrl-C there cancels what has not started
    # and ends the process as Python ends one a KeyboardInterrupt stopped
    # (killed by SIGINT, as the uncaught Ctrl-C above), whatever status it was
    # exiting with.
    _, elapsed, code, out, err = _interrupt(ending)
    assert code == -signal.SIGINT, err
    assert "torchneuron: interrupted at exit; the device work still queued was cancelled: neuron:0 (" in err, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert elapsed < 5, elapsed


def test_exit_waits_for_queued_work_at_most_the_exit_timeout():
    r = run_python(textwrap.dedent(LONG_QUEUE) + "t0 = time.monotonic()\n", env={"TORCHNEURON_EXIT_TIMEOUT": "0.5"})
    assert r.returncode == 0, r.stderr
    assert "still had queued work after TORCHNEURON_EXIT_TIMEOUT=0.5 s at exit; it was cancelled" in r.stderr
