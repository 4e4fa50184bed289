"""Helpers of the torch.distributed tests: spawned ranks that report back,
and attempts whose failure is a result rather than an exception."""
import io
import queue as queue_module
import socket
import traceback

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(target, world: int, *args, timeout: float = 150, may_die: tuple = ()) -> dict:
    """Runs ``target(rank, world, port, *args)`` in ``world`` spawned
    processes; returns {rank: what the rank returned}. Results travel as
    ``torch.save`` bytes (a rank ends before the parent reads them, so no
    shared tensors). A rank that dies or raises fails at once, not at the
    timeout, with its traceback; the ranks in ``may_die`` may die without
    reporting (a fault test kills them), the others must still report and exit."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_run_rank, args=(target, rank, world, port, args, results)) for rank in range(world)]
    for p in procs:
        p.start()
    got, errors = {}, {}
    try:
        import time
        deadline = time.monotonic() + timeout
        while len(got) + len(errors) < world - len(may_die):
            try:
                rank, ok, payload = results.get(timeout=1)
            except queue_module.Empty:
                dead = [p.exitcode for r, p in enumerate(procs)
                        if r not in may_die and not p.is_alive() and p.exitcode != 0]
                assert not dead, f"a rank died with exit code {dead}; reported: {sorted(got)}, errors: {errors}"
                if time.monotonic() >= deadline:
                    raise AssertionError(f"ranks still running after {timeout} s; reported: {sorted(got)}\n"
                                         + _stacks([p for r, p in enumerate(procs) if r not in got]))
                continue
            if ok:
                got[rank] = torch.load(io.BytesIO(payload), weights_only=False)
            else:
                errors[rank] = payload
        assert not errors, "\n".join(f"rank {r}:\n{tb}" for r, tb in sorted(errors.items()))
        for r, p in enumerate(procs):
            p.join(timeout=30)
            assert p.exitcode == 0 or r in may_die, [q.exitcode for q in procs]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return got


def _stacks(procs) -> str:
    """The native and Python stacks of every thread of hung ranks (gdb's, where
    it is installed): what a hang is waiting for."""
    import shutil
    import subprocess
    if not shutil.which("gdb"):
        return "(no gdb: no stacks)"
    out = []
    for p in procs:
        r = subprocess.run(["gdb", "-p", str(p.pid), "-batch", "-nx", "-ex", "thread apply all bt 30"],
                           capture_output=True, text=True, timeout=120)
        out.append(f"--- rank pid {p.pid} ---\n{r.stdout[-400000:]}")
    return "\n".join(out)


def _run_rank(target, rank, world, port, args, results):
    import torchneuron  # noqa: F401

    try:
        value = target(rank, world, port, *args)
        buffer = io.BytesIO()
        torch.save(value, buffer)
        results.put((rank, True, buffer.getvalue()))
    except BaseException:  # noqa: BLE001  (reported to the parent, which fails the test)
        results.put((rank, False, traceback.format_exc()))
        raise


def attempt(fn, *args, **kwargs) -> dict:
    """``fn``'s value, or the exception it raised (type name and message), so
    that a rank can report a known failure and go on with the next part."""
    try:
        return {"value": fn(*args, **kwargs)}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}


def value_of(result: dict):
    """The value an :func:`attempt` returned; raises RuntimeError with the
    rank's error if it failed (what a strict xfail expects)."""
    if "error" in result:
        raise RuntimeError(result["error"])
    return result["value"]


# The small model, data and state the differential training tests share.

def small_mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def mlp_batches(steps: int, batch: int):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 8, generator=g), torch.randn(batch, 4, generator=g)) for _ in range(steps)]


def rank_share(t, rank, world):
    """The rank's rows of a global batch."""
    n = t.shape[0] // world
    return t[rank * n:(rank + 1) * n]


def full_state(model):
    """Parameters and buffers by name, gathered, on the CPU, with the names of the
    unwrapped model (no DDP, FSDP1 or checkpoint-wrapper prefixes)."""
    out = {}
    for k, v in model.state_dict().items():
        v = v.full_tensor() if isinstance(v, torch.distributed.tensor.DTensor) else v
        out[k.removeprefix("module.").removeprefix("_fsdp_wrapped_module.")
              .replace("._fsdp_wrapped_module", "").replace("._checkpoint_wrapped_module", "")] = v.detach().cpu()
    return out
