"""The sanitizers' cost: the demo's training step (examples/gpt_model.py, the
end-to-end benchmark's sizes) with and without the stream sanitizer
(torchneuron/sanitizer.py), alternating repeat by repeat, medians.

    .venv/bin/python -m benchmarks.sanitizer [--smoke]
"""
from __future__ import annotations

import torch

from . import end_to_end as e2e
from .common import NEURON, Config, median, timed

STEPS = 1
SLOWDOWN_MAX = 3.0  # issue 26: the race detector costs at most 3x


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
    out = {"gpt_train_step": {"plain_s": median(plain), "sanitized_s": median(checked),
                              "plain_samples_s": plain, "sanitized_samples_s": checked,
                              "operators_per_step": operators}}
    out["gpt_train_step"]["slowdown"] = out["gpt_train_step"]["sanitized_s"] / out["gpt_train_step"]["plain_s"]
    return out


def targets(res: dict) -> list[dict]:
    r = res.get("sanitizer", {}).get("gpt_train_step")
    if r is None:
        return []
    return [{"group": "sanitizer", "name": "stream sanitizer, demo training step",
             "figure": "x the step's time without it", "value": r["slowdown"],
             "threshold": f"<= {SLOWDOWN_MAX}", "met": bool(r["slowdown"] <= SLOWDOWN_MAX)}]


def markdown(res: dict) -> str:
    s = ["## Sanitizers' cost", "", "The demo's training step with and without each checker, alternating, medians.", "",
         "| workload | without | with | slowdown |", "|---|---|---|---|"]
    for name, r in res.items():
        s.append(f"| {name} | {r['plain_s'] * 1e3:.1f} ms | {r['sanitized_s'] * 1e3:.1f} ms | {r['slowdown']:.2f}x |")
    return "\n".join(s) + "\n"


if __name__ == "__main__":
    from benchmarks.common import run_alone

    torch.manual_seed(0)
    run_alone("sanitizer", run, targets)
