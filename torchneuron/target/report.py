"""Time and cost per workload on the target, from a twin summary.

``python -m torchneuron.target SUMMARY.json --usd-per-hour P`` (a summary as
:func:`torchneuron.target.summary` returns it, or a JSON file holding one, such
as the demo's ``artifacts/summary.json``) prints the modelled time per step,
per epoch and per million tokens, and their cost at the instance price the
user gives, for the data-parallel width asked for. The price is the user's:
list prices change and differ by region and purchase option, so none is
built in. Every figure is labelled modelled, and the assumptions are listed.
"""
from __future__ import annotations

import argparse
import json
import sys

from . import figures


def workload(summary: dict, *, usd_per_hour: float | None = None, instance: str | None = None,
             chips: int | None = None, data_parallel: int = 1, steps_per_epoch: int | None = None,
             tokens_per_step: int | None = None, include_compile: bool = False) -> dict:
    """The modelled time and cost of a workload: one data-parallel replica per logical
    core, ``data_parallel`` of them, each running the summary's step.

    ``tokens_per_step`` is per replica. Collectives between replicas are not modelled
    (listed among the assumptions)."""
    target, lnc = summary["target"], summary["lnc"]
    core = figures.logical_core(target, lnc)
    steps = summary.get("steps") or 1
    step_s = summary["device_s"] / steps
    if include_compile:
        step_s += summary["compile_s"] / steps
    if chips is None and instance is not None:
        known = figures.INSTANCES.get(target, {})
        if instance not in known:
            raise ValueError(f"unknown {target} instance {instance!r}: the known ones are "
                             f"{', '.join(known) or 'none'}; give chips= instead")
        chips = known[instance]
    cores_per_instance = chips * core.cores_per_chip if chips else None
    if cores_per_instance is not None and data_parallel > cores_per_instance:
        instances = -(-data_parallel // cores_per_instance)
    else:
        instances = 1
    out = {
        "target": target, "lnc": lnc, "modelled": True,
        "step_s": step_s, "data_parallel": data_parallel,
        "steps_per_s": 1 / step_s if step_s else None,
        "epoch_s": step_s * steps_per_epoch if steps_per_epoch else None,
        "s_per_million_tokens": (step_s / (tokens_per_step * data_parallel) * 1e6) if tokens_per_step else None,
        "logical_cores_per_instance": cores_per_instance,
        "instances": instances if cores_per_instance else None,
        "assumptions": dict(summary.get("assumptions") or figures.ASSUMED,
                            collectives="gradient all-reduce between replicas is not modelled"),
    }
    if usd_per_hour is not None:
        if cores_per_instance is None:
            raise ValueError("a price per instance-hour needs the instance (instance= or chips=)")
        # The replicas' share of the instances they occupy: idle cores of a rented instance are paid too.
        usd_per_s = usd_per_hour * instances / 3600
        out["usd_per_hour"] = usd_per_hour
        out["usd_per_step"] = usd_per_s * step_s
        out["usd_per_epoch"] = usd_per_s * out["epoch_s"] if out["epoch_s"] else None
        out["usd_per_million_tokens"] = (usd_per_s * out["s_per_million_tokens"]
                                         if out["s_per_million_tokens"] else None)
    return out


def _fmt_s(s):
    if s is None:
        return "-"
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s" if s < 3600 else f"{s / 3600:.3g} h"


def render(summary: dict, w: dict) -> str:
    rows = [
        ("target", f"{summary['device']} ({w['target']}), LNC={w['lnc']}"),
        ("modelled device time per step", _fmt_s(w["step_s"])),
        ("  by bound", ", ".join(f"{k} {v / max(summary['device_s'], 1e-30):.0%}"
                                 for k, v in sorted(summary["bound_s"].items(), key=lambda kv: -kv[1]))),
        ("launches per step (operators fused)", f"{summary.get('launches', 0) / (summary.get('steps') or 1):.0f} "
                                                f"({summary.get('fused_ops', 0) / (summary.get('steps') or 1):.0f})"),
        ("compiles (eager signatures, graphs)", f"{summary['eager_compiles']}, {summary['graph_compiles']} "
                                                f"(modelled {_fmt_s(summary['compile_s'])} cold)"),
        ("data-parallel replicas", str(w["data_parallel"])),
        ("per epoch", _fmt_s(w["epoch_s"])),
        ("per million tokens", _fmt_s(w["s_per_million_tokens"])),
    ]
    if "usd_per_hour" in w:
        rows += [("price (instance-hour, given)", f"${w['usd_per_hour']:.2f} x {w['instances']} instance(s)"),
                 ("cost per step", f"${w['usd_per_step']:.3g}"),
                 ("cost per epoch", f"${w['usd_per_epoch']:.3g}" if w["usd_per_epoch"] else "-"),
                 ("cost per million tokens", f"${w['usd_per_million_tokens']:.3g}"
                  if w["usd_per_million_tokens"] else "-")]
    width = max(len(k) for k, _ in rows)
    lines = ["Modelled on the target (not measured): " + ", ".join(rows[0][1:])]
    lines += [f"  {k:<{width}}  {v}" for k, v in rows[1:]]
    if summary.get("churn"):
        first = summary["churn"][0]
        lines.append(f"  shape churn: {len(summary['churn'])} operator(s) at lines that keep making new shapes, "
                     f"first {first['op']} at {first['site']}")
    lines.append("  top operators: " + "; ".join(f"{o['op']} {o['share']:.0%} ({o['bound']})"
                                                  for o in summary["top_ops"][:5]))
    lines.append("  assumptions: " + "; ".join(w["assumptions"].values()))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchneuron.target", description=__doc__.split("\n\n")[0])
    p.add_argument("summary", help="a JSON file with a twin summary (or a file with one under the key 'target')")
    p.add_argument("--usd-per-hour", type=float, help="the instance's price per hour (yours: on-demand, reserved, ...)")
    p.add_argument("--instance", help="an instance name (" + ", ".join(
        n for names in figures.INSTANCES.values() for n in names) + ")")
    p.add_argument("--chips", type=int, help="chips per instance, for an instance not listed")
    p.add_argument("--data-parallel", type=int, default=1, help="replicas, one per logical core")
    p.add_argument("--steps-per-epoch", type=int)
    p.add_argument("--tokens-per-step", type=int, help="tokens one replica processes per step")
    p.add_argument("--include-compile", action="store_true", help="spread the cold compile time over the steps")
    a = p.parse_args(argv)
    with open(a.summary) as f:
        summary = json.load(f)
    summary = summary.get("target", summary) if isinstance(summary.get("target"), dict) else summary
    try:
        w = workload(summary, usd_per_hour=a.usd_per_hour, instance=a.instance, chips=a.chips,
                     data_parallel=a.data_parallel, steps_per_epoch=a.steps_per_epoch,
                     tokens_per_step=a.tokens_per_step, include_compile=a.include_compile)
    except ValueError as e:
        p.error(str(e))
    print(render(summary, w))
    return 0


if __name__ == "__main__":
    sys.exit(main())
