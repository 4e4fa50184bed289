"""The sanitizers' cost: the demo's training step (examples/gpt_model.py, the
end-to-end benchmark's sizes) with and without the stream sanitizer
(torchneuron/sanitizers/stream.py), alternating repeat by repeat, medians; and with
and without the device memory checker (TORCHNEURON_MEMCHECK, switched on when
the library loads), in child processes that alternate, medians of each
child's median.

    .venv/bin/python -m benchmarks.sanitizer [--smoke]
"""
from __future__ import annotations

import os

import torch

from . import end_to_end as e2e
from .common import NEURON, Config, median, timed

STEPS = 2  # the stream sanitizer's timing, the memory checker's
SLOWDOWN_MAX = 3.0  # the race detector costs at most 3x
MEMCHECK_SLOWDOWN_MAX = 1.5  # and the memory checker at most 1.5x


def run(cfg: Config, bar) -> dict:
    from torchneuron.sanitizer import stream_sanitizer

    step = e2e.gpt_train(cfg)(NEURON)
    steps_per_sample = cfg.pick(3, 1)

    def steps():
        for _ in range(steps_per_sample):
            step()

    for _ in range(2):  # warm-up: meta caches, first-call verdicts, the allocator's blocks
        timed(steps, NEURON)
        with stream_sanitizer():
            timed(steps, NEURON)
    plain, checked, operators = [], [], 0
    for _ in range(cfg.pick(7, 2)):
        plain.append(timed(steps, NEURON) / steps_per_sample)
        with stream_sanitizer() as san:
            checked.append(timed(steps, NEURON) / steps_per_sample)
        assert not san.reports, san.reports
        operators = san.seq // steps_per_sample
    bar.update(1)
    memcheck = memcheck_cost(cfg)
    bar.update(1)
    out = {"gpt_train_step": {"plain_s": median(plain), "sanitized_s": median(checked),
                              "plain_samples_s": plain, "sanitized_samples_s": checked,
                              "operators_per_step": operators}}
    out["gpt_train_step"]["slowdown"] = out["gpt_train_step"]["sanitized_s"] / out["gpt_train_step"]["plain_s"]
    out["memcheck_gpt_train_step"] = memcheck
    return out


def _child_step_times(smoke: bool, samples: int) -> None:
    """In a child process: the step's time, `samples` times after warm-up, as JSON."""
    import json

    cfg = Config(smoke=smoke)
    step = e2e.gpt_train(cfg)(NEURON)
    for _ in range(3):
        timed(step, NEURON)
    times = [timed(step, NEURON) for _ in range(samples)]
    extra = {}
    if os.environ.get("TORCHNEURON_MEMCHECK"):
        import torchneuron.memcheck as mc
        extra = {"stats": mc.stats(), "reports": [str(r) for r in mc.reports()], "protecting": mc.protecting()}
    print(json.dumps({"times": times, **extra}))


def memcheck_cost(cfg: Config) -> dict:
    import json
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    samples = cfg.pick(7, 2)

    def child(memcheck: bool) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "TORCHNEURON_MEMCHECK"}
        if memcheck:
            env["TORCHNEURON_MEMCHECK"] = "1"
        code = f"from benchmarks.sanitizer import _child_step_times; _child_step_times({cfg.smoke}, {samples})"
        p = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                           timeout=cfg.pick(900, 300))
        if p.returncode != 0:
            raise RuntimeError(f"the step's child process (memory checker {'on' if memcheck else 'off'}) failed: "
                               f"{p.stderr[-2000:]}")
        return json.loads(p.stdout.strip().splitlines()[-1])

    plain, checked, last = [], [], {}
    for _ in range(cfg.pick(3, 1)):
        plain.append(median(child(False)["times"]))
        last = child(True)
        assert not last["reports"], last["reports"]
        checked.append(median(last["times"]))
    return {"plain_s": median(plain), "memcheck_s": median(checked), "plain_child_medians_s": plain,
            "memcheck_child_medians_s": checked, "slowdown": median(checked) / median(plain),
            "host_access_protection": last["protecting"], "memcheck_stats": last["stats"]}


def targets(res: dict) -> list[dict]:
    out = []
    if r := res.get("sanitizer", {}).get("gpt_train_step"):
        out.append({"group": "sanitizer", "name": "stream sanitizer, demo training step",
                    "figure": "x the step's time without it", "value": r["slowdown"],
                    "threshold": f"<= {SLOWDOWN_MAX}", "met": bool(r["slowdown"] <= SLOWDOWN_MAX)})
    if r := res.get("sanitizer", {}).get("memcheck_gpt_train_step"):
        out.append({"group": "sanitizer", "name": "memory checker, demo training step",
                    "figure": "x the step's time without it", "value": r["slowdown"],
                    "threshold": f"<= {MEMCHECK_SLOWDOWN_MAX}", "met": bool(r["slowdown"] <= MEMCHECK_SLOWDOWN_MAX)})
    return out


def markdown(res: dict) -> str:
    s = ["## Sanitizers' cost", "", "The demo's training step with and without each checker, alternating, medians "
         "(the memory checker in alternating child processes).", "",
         "| checker | without | with | slowdown |", "|---|---|---|---|"]
    for name, key, r in (("stream sanitizer", "sanitized_s", res.get("gpt_train_step")),
                         ("device memory checker", "memcheck_s", res.get("memcheck_gpt_train_step"))):
        if r:
            s.append(f"| {name} | {r['plain_s'] * 1e3:.1f} ms | {r[key] * 1e3:.1f} ms | {r['slowdown']:.2f}x |")
    return "\n".join(s) + "\n"


if __name__ == "__main__":
    from benchmarks.common import run_alone

    torch.manual_seed(0)
    run_alone("sanitizer", run, targets)
