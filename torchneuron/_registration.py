"""Makes ``neuron`` a PyTorch device: the backend name, ``torch.neuron``, and
the generated ``Tensor.neuron()`` / ``Module.neuron()`` / storage methods."""
import atexit
import os
import sys
import time

import torch

from . import _C


def _exit_timeout() -> float:
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
    exit by an uncaught exception (Ctrl-C included), a Ctrl-C during this
    wait, or the timeout cancels what has not started: no one can read its
    results any more. Errors never raised are printed, and the exit status
    becomes 1 if it would have been 0.
    """
    from . import device

    if _forked_child:
        _release_inherited_autograd_threads()
    if not device.is_initialized():  # never started, or a child forked after its parent started it
        return
    indices = range(device.device_count())
    if getattr(sys, "last_type", None) is not None:  # an uncaught exception ends the process
        for i in indices:
            _C._cancel_pending(i)
    deadline = time.monotonic() + _exit_timeout()
    for i in indices:
        try:
            if not _C._wait_idle(i, max(0.0, deadline - time.monotonic())):
                print(f"torchneuron: neuron:{i} still had queued work after TORCHNEURON_EXIT_TIMEOUT="
                      f"{_exit_timeout():g} s at exit; it was cancelled", file=sys.stderr)
        except KeyboardInterrupt:
            pass
        finally:
            _C._cancel_pending(i)
        _C._wait_idle(i, float("inf"))  # the task running now, at most
    errors = [_C._device_errors(i) for i in indices]
    unreported = [m for e in errors for m in e["unreported_errors"]]
    if unreported:
        print(f"torchneuron: {sum(e['unreported'] for e in errors)} device error(s) were never raised by a synchronising call "
              "(call torch.accelerator.synchronize() to see them where they happen):", file=sys.stderr)
        for message in unreported:
            print("  " + message.replace("\n", "\n  "), file=sys.stderr)
        if getattr(sys, "last_type", None) is None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)


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


def register():
    if getattr(torch, "neuron", None) is not None:
        return
    torch.utils.rename_privateuse1_backend("neuron")
    from . import device as device_module

    torch._register_device_module("neuron", device_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    atexit.register(_drain_at_exit)
    os.register_at_fork(after_in_child=_note_fork)
