"""Makes ``neuron`` a PyTorch device: the backend name, ``torch.neuron``, and
the generated ``Tensor.neuron()`` / ``Module.neuron()`` / storage methods."""
import atexit
import os
import sys
import time

import torch

from . import _C
from . import neuron as device_module
from .neuron import memory, random  # noqa: F401  (imported, they are torch.neuron.memory and .random)
from .neuron.storage_types import storage_classes


def _exit_timeout() -> float:
    """TORCHNEURON_EXIT_TIMEOUT, which the runtime checked at the first device
    use (csrc/runtime/config.cpp); unset or empty, 60 s."""
    try:
        return float(os.environ.get("TORCHNEURON_EXIT_TIMEOUT", "60"))
    except ValueError:
        return 60.0


def _drain_at_exit():
    """Bounds the device work a process leaves behind, then reports errors no
    synchronising call raised.

    Queued work must finish or be cancelled before the interpreter tears down
    the libraries it runs in. A normal exit lets it finish (its errors are
    then reported) for at most ``TORCHNEURON_EXIT_TIMEOUT`` seconds (60); an
    exit by an uncaught exception (Ctrl-C included) or the timeout cancels
    what has not started: no one can read its results any more. A Ctrl-C
    during this wait cancels it too, says so, and the process then ends as
    Python ends one a KeyboardInterrupt stopped: killed by SIGINT (status
    130 in a shell). Errors never raised are printed, and an exit status of
    0 becomes 1; a status the program chose (``sys.exit(3)``) stays. The
    status changes happen in C at exit() (``_C._set_exit_outcome``), after
    the interpreter has finalised. A child forked after its parent started
    the device has nothing to drain: the work and the errors are the
    parent's.
    """
    if _forked_child:
        _release_inherited_autograd_threads()
    if not device_module.is_initialized():
        return
    indices = range(device_module.device_count())
    interrupted = False
    if getattr(sys, "last_type", None) is None:  # no uncaught exception ends the process: let the work finish
        deadline = time.monotonic() + _exit_timeout()
        try:
            for i in indices:
                if not _C._wait_idle(i, max(0.0, deadline - time.monotonic())):
                    print(f"torchneuron: neuron:{i} still had queued work after TORCHNEURON_EXIT_TIMEOUT="
                          f"{_exit_timeout():g} s at exit; it was cancelled", file=sys.stderr)
        except KeyboardInterrupt:
            interrupted = True
    cancelled = [_C._cancel_pending(i) for i in indices]
    if interrupted:
        queued = ", ".join(f"neuron:{i} ({n} task(s))" for i, n in zip(indices, cancelled) if n) or "none"
        print(f"torchneuron: interrupted at exit; the device work still queued was cancelled: {queued}",
              file=sys.stderr)
        _C._set_exit_outcome("interrupted")
    for i in indices:
        _wait_uninterrupted(i)  # the task running now, at most
    errors = [_C._device_errors(i) for i in indices]
    unreported = [m for e in errors for m in e["unreported_errors"]]
    if unreported:
        print(f"torchneuron: {sum(e['unreported'] for e in errors)} device error(s) were never raised by a synchronising call "
              "(call torch.accelerator.synchronize() to see them where they happen):", file=sys.stderr)
        for message in unreported:
            print("  " + message.replace("\n", "\n  "), file=sys.stderr)
        _C._set_exit_outcome("unreported_errors")
    if not _forked_child and not interrupted:
        _settle_autograd_threads(indices)  # after the drain: its errors are the program's, reported above


_forked_child = False


def _note_fork() -> None:
    global _forked_child
    _forked_child = True


def _release_inherited_autograd_threads() -> None:
    """The autograd engine of a process that ran a backward has a thread per
    device index of the backends with devices (neuron's among them), and at
    exit waits up to 10 s for them to stop. A forked child inherits the count
    but not the threads, so its exit would wait the full 10 s (the stock CPU
    build, with no such backend, has no threads to wait for). PyTorch resets
    the engine of a forked child at its first use there (a backward, or any
    call on the engine): this is such a call."""
    torch.autograd.Variable._execution_engine.is_checkpoint_valid()


# What the exit's backward passes use; kept alive to the end, so that the autograd threads
# drop their references to them without touching Python objects.
_settling: list = []


def _settle_autograd_threads(indices) -> None:
    """A backward on `neuron` runs on the autograd engine's thread for the device, which
    drops its last reference to the backward's GraphTask after the caller has returned.
    The GraphTask holds a Python object (the contextvars context torch.autograd stashes
    for device threads), so if the process is finalising by then, the thread's decref
    takes the GIL, the interpreter ends the thread with pthread_exit, and the forced
    unwinding through a noexcept destructor aborts the process ("terminate called
    without an active exception"). One more backward per device, run through the engine
    directly (nothing stashed) on tensors kept alive here, queues behind the last one:
    when it returns, each device thread has dropped the previous GraphTask, with the GIL
    free for it to take, and what it drops of this one needs no Python."""
    engine = torch.autograd.Variable._execution_engine
    for i in indices:
        try:
            leaf = torch.ones(1, device=torch.device("neuron", i), requires_grad=True)
            out = leaf * 2.0
            seed = torch.ones_like(out)
            _settling.extend((leaf, out, seed))
            engine.run_backward((out,), (seed,), False, False, (), True, True)
        except Exception:  # noqa: BLE001  (a device left in error: nothing to settle, the drain reports it)
            pass


def _wait_uninterrupted(index: int) -> None:
    """Waits until the device's running task ends; a Ctrl-C cannot cut it
    short (the interpreter must not tear down what a task runs in), but marks
    the exit as interrupted."""
    while True:
        try:
            _C._wait_idle(index, float("inf"))
            return
        except KeyboardInterrupt:
            _C._set_exit_outcome("interrupted")


def register():
    if getattr(torch, "neuron", None) is not None:
        return
    torch.utils.rename_privateuse1_backend("neuron")
    # torch.neuron.FloatStorage and the others: Tensor.storage_type() finds a
    # device's typed storage classes on its device module.
    for name, cls in storage_classes().items():
        setattr(device_module, name, cls)
    # The memory functions torch.cuda also has at its top level: memory.py is built on the
    # device module's functions, so they are attached here, not imported by it.
    for name in memory.ON_DEVICE_MODULE:
        setattr(device_module, name, getattr(memory, name))
    torch._register_device_module("neuron", device_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    atexit.register(_drain_at_exit)
    os.register_at_fork(after_in_child=_note_fork)
