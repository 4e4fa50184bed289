"""Where the time goes on neuron: the host path of a GPT training step.

1. Components: host issue time of one step from an idle device (Python runs
   ahead; the device may still be working), the completed time (issue +
   synchronize), the number of device operators per step, and so the host
   cost per operator.
2. cProfile of a few neuron steps: Python-side functions by own time (calls
   into the C++ extension and ATen appear as the builtin that made them).
3. perf (if installed and permitted): sampled native stacks of the same
   steps, top symbols by own samples.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import shutil
import signal
import subprocess
import tempfile
import time

import torch
import torchneuron

from . import end_to_end as e2e
from .common import CPU, NEURON, Config, median, sync, timed

STEPS = 3


def _components(step, cfg: Config) -> dict:
    step()
    sync(NEURON)
    torchneuron.clear_op_tracking()
    step()
    sync(NEURON)
    ops = torchneuron.get_executed_ops()
    n_ops = sum(v for v in ops.values()) if isinstance(ops, dict) else len(ops)
    issue, done = [], []
    for _ in range(cfg.repeats):
        issue.append(timed(step, NEURON, wait=False))
        done.append(timed(step, NEURON))
    return {"ops_per_step": n_ops, "host_issue_s": median(issue), "completed_s": median(done),
            "host_us_per_op": median(issue) / max(n_ops, 1) * 1e6,
            "device_tail_s": median(done) - median(issue)}


def _cprofile(step, k: int) -> list[dict]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(k):
        step()
    sync(NEURON)
    prof.disable()
    st = pstats.Stats(prof)
    rows = []
    total = sum(v[2] for v in st.stats.values())
    for (file, line, fn), (cc, nc, tt, ct, _) in st.stats.items():
        rows.append({"function": f"{os.path.basename(file)}:{line}({fn})" if line else fn,
                     "calls_per_step": nc / k, "own_s": tt / k, "cumulative_s": ct / k, "own_fraction": tt / total})
    rows.sort(key=lambda r: -r["own_s"])
    return rows[:15]


def _perf(step, k: int) -> dict | None:
    if not shutil.which("perf"):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        rec = subprocess.Popen(["perf", "record", "-q", "-F", "999", "-p", str(os.getpid()), "-o", data],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        if rec.poll() is not None:
            return None
        for _ in range(k):
            step()
        sync(NEURON)
        rec.send_signal(signal.SIGINT)
        rec.wait(timeout=60)
        rep = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "-q",
                              "--sort", "comm,dso,sym", "--percent-limit", "1"],
                             capture_output=True, text=True, timeout=120)
    rows = []
    for line in rep.stdout.splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[0].endswith("%"):
            rows.append({"percent": float(parts[0][:-1]), "thread": parts[1], "dso": parts[2],
                         "symbol": parts[3].replace("[.] ", "").replace("[k] ", "")[:120]})
    return {"top": rows[:20]} if rows else None


def run(cfg: Config, bar) -> dict:
    step = e2e.gpt_train(cfg)(NEURON)
    out = {"workload": "gpt_train_step", "components": _components(step, cfg)}
    cpu_step = e2e.gpt_train(cfg)(CPU)
    cpu_step()
    out["components"]["cpu_step_s"] = median([timed(cpu_step, CPU) for _ in range(cfg.repeats)])
    bar.update(1)
    out["cprofile_top"] = _cprofile(step, cfg.pick(5, 1))
    bar.update(1)
    out["perf_top"] = None if cfg.smoke else _perf(step, 10)
    bar.update(1)
    return out
