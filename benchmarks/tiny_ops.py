"""Per-operator cost on tiny tensors (a few elements).

For each operator, N calls are issued in a Python loop. On neuron two times
are taken from an idle device: the enqueue time (the host returned from the
N calls; the device may still be working) and the completed time (N calls
then synchronize). The CPU backend's time is the N calls. Reported per
operator call: median over repeats, devices alternating; three times the
suite's repeats, since a sample lasts milliseconds and a shared host's other
work moves single samples a lot. Beside the times, the process's CPU time
for the completed samples (every thread: the host's and the executor's) and
for the CPU backend's: what the work costs the cores whatever else runs on
them, the figure a loaded host's times follow.

Two rows are steps of two operators, the shape of optimizer and small-state
code: `dependent_step` updates a state that each step reads (`a = a * 0.999 +
b`), `independent_step` computes the same two operators from unchanged
operands. Their figures are per step.
"""

from __future__ import annotations

import time

import torch

from .common import CPU, NEURON, Config, median, timed


def _cases(device: torch.device) -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, generator=g).to(device)
    y = torch.randn(8, generator=g).to(device)
    idx = torch.tensor([0, 3, 5, 7]).to(device)
    a = torch.randn(16, 16, generator=g).to(device)
    b = torch.randn(16, 16, generator=g).to(device)
    s = torch.randn(1, generator=g).to(device)
    state = [x]

    def dependent_step():
        state[0] = state[0] * 0.999 + y
        return state[0]

    return {
        "add": lambda: x + y,
        "mul": lambda: x * y,
        "relu": lambda: torch.relu(x),
        "sum": lambda: x.sum(),
        "index": lambda: x[idx],
        "cat": lambda: torch.cat((x, y)),
        "mm_16x16": lambda: a @ b,
        "view": lambda: x.view(2, 4),
        "item": lambda: s.item(),
        "dependent_step": dependent_step,
        "independent_step": lambda: x * 0.999 + y,
    }

#: rows whose figure is per step of two operators (see the top)
STEPS_OF_TWO = ("dependent_step", "independent_step")


NAMES = list(_cases(CPU))
STEPS = len(NAMES)


def _loop(op, n):
    def run():
        for _ in range(n):
            op()
    return run


def run(cfg: Config, bar) -> dict:
    n = cfg.pick(2000, 50)
    cases = {d.type: _cases(d) for d in (NEURON, CPU)}
    out = {"calls_per_sample": n, "ops": {}}
    for name in NAMES:
        nrn, cpu = _loop(cases["neuron"][name], n), _loop(cases["cpu"][name], n)
        for f, d in ((nrn, NEURON), (cpu, CPU)):  # warm-up: meta cache, allocator
            timed(f, d)
        enq, done, host, done_cpu, host_cpu = [], [], [], [], []
        for _ in range(3 * cfg.repeats):
            enq.append(timed(nrn, NEURON, wait=False) / n)
            c = time.process_time()
            done.append(timed(nrn, NEURON) / n)
            done_cpu.append((time.process_time() - c) / n)
            c = time.process_time()
            host.append(timed(cpu, CPU) / n)
            host_cpu.append((time.process_time() - c) / n)
        r = {"neuron_enqueue_s": median(enq), "neuron_completed_s": median(done), "cpu_s": median(host),
             "neuron_cpu_time_s": median(done_cpu), "cpu_cpu_time_s": median(host_cpu),
             "neuron_enqueue_samples_s": enq, "neuron_completed_samples_s": done, "cpu_samples_s": host}
        r["ratio_enqueue"] = r["neuron_enqueue_s"] / r["cpu_s"]
        r["ratio_completed"] = r["neuron_completed_s"] / r["cpu_s"]
        r["ratio_cpu_time"] = r["neuron_cpu_time_s"] / r["cpu_cpu_time_s"]
        out["ops"][name] = r
        bar.update(1)
    return out
