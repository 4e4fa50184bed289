#!/usr/bin/env python
"""Run the neuron-vs-CPU benchmark suite; write RESULTS.md, results.json, plots.

    .venv/bin/python benchmarks/run.py                  # full run (~10 min)
    .venv/bin/python benchmarks/run.py --smoke          # seconds, tiny sizes
    .venv/bin/python benchmarks/run.py --only tiny_ops  # one group (limits always run)
    .venv/bin/python benchmarks/run.py --only nki_kernels --merge  # rerun one group into the results
    .venv/bin/python benchmarks/run.py --only torchtitan --merge   # a group run only on request
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torchneuron  # noqa: E402
from tqdm import tqdm  # noqa: E402

from benchmarks import (compiled, distributed, end_to_end, flex_attention, fusion_workloads, huggingface,  # noqa: E402
                        large_ops, limits, lockin, memory, nki_kernels, nki_library, profile_host, profiler, report,
                        sanitizer, soak, tiny_ops, torchtitan_step)
from benchmarks.common import Config, machine  # noqa: E402

GROUPS = {"tiny_ops": tiny_ops, "large_ops": large_ops, "end_to_end": end_to_end, "fusion_workloads": fusion_workloads,
          "memory": memory, "profile": profile_host, "nki_kernels": nki_kernels, "nki_library": nki_library,
          "compiled": compiled,
          "huggingface": huggingface, "profiler": profiler, "lockin": lockin, "distributed": distributed,
          "sanitizer": sanitizer, "soak": soak, "flex_attention": flex_attention, "torchtitan": torchtitan_step}

#: groups run only when named with --only: a minute or more even at smoke size
ON_REQUEST = ("torchtitan",)

#: groups run again in a child process with ATEN_CPU_CAPABILITY=avx2 when this
#: host's own level is AVX-512 (their rows on the AVX2 path; large_ops does its own)
AVX2_RERUN = ("end_to_end", "compiled")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, few repeats: seconds")
    p.add_argument("--only", choices=sorted(GROUPS), action="append",
                   help="run only this group (repeatable); the machine limits always run")
    p.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)),
                   help="directory for RESULTS.md, results.json and the plots")
    p.add_argument("--merge", action="store_true",
                   help="with --only: replace those groups in OUT/results.json and keep the others "
                        "(the report names the groups rerun, with their date and load)")
    p.add_argument("--from-json", action="store_true",
                   help="only re-render RESULTS.md and the plots from OUT/results.json")
    args = p.parse_args(argv)
    if args.from_json:
        with open(os.path.join(args.out, "results.json")) as f:
            results = json.load(f)
        return write_report(results, args.out)
    cfg = Config(smoke=args.smoke)
    selected = args.only or [g for g in GROUPS if g not in ON_REQUEST]
    os.makedirs(args.out, exist_ok=True)

    torch.empty(1, device="neuron")  # initialise the device outside the timings
    results = {"machine": machine(), "config": {"smoke": cfg.smoke, "repeats": cfg.repeats, "groups": selected}}
    t0 = time.perf_counter()
    total = limits.STEPS + sum(GROUPS[g].STEPS for g in selected) + any(g in selected for g in AVX2_RERUN)
    with tqdm(total=total, unit="bench", dynamic_ncols=True) as bar:
        bar.set_description("limits")
        results["limits"] = limits.run(cfg, bar)
        results["group_elapsed_s"] = {"limits": time.perf_counter() - t0}
        for name in selected:
            bar.set_description(name)
            mod = GROUPS[name]
            t = time.perf_counter()
            if mod is large_ops:
                results[name] = mod.run(cfg, bar, results["limits"])
                results["large_ops_avx2"] = mod.run_avx2_path(cfg, bar)
            else:
                results[name] = mod.run(cfg, bar)
            results["group_elapsed_s"][name] = time.perf_counter() - t
        forced = [g for g in AVX2_RERUN if g in selected]
        if forced:
            bar.set_description("AVX2 path forced")
            t = time.perf_counter()
            results |= {f"{g}_avx2": r for g, r in _forced_avx2(forced, cfg).items()}
            results["group_elapsed_s"]["avx2_rerun"] = time.perf_counter() - t
            bar.update(1)
    results["elapsed_s"] = time.perf_counter() - t0
    results["loadavg_end"] = list(os.getloadavg())
    if args.merge:
        results = _merged(os.path.join(args.out, "results.json"), results, selected)
    results["targets"] = report.targets(results)

    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    write_report(results, args.out)
    print(f"wrote {args.out}/results.json in {results['elapsed_s']:.0f} s")
    return results


def _forced_avx2(groups: list[str], cfg: Config) -> dict:
    """``groups`` run on the AVX2 path, forced as a user forces it: ATen's kernels, the device's own
    loops and Inductor's generated code all at AVX2. Empty where the host's own level is AVX2 or lower
    (its native run is that path)."""
    if torchneuron._C._isa()["path"] != "avx512":
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "benchmarks.run", "--out", tmp, *(a for g in groups for a in ("--only", g))]
        p = subprocess.run(argv + ["--smoke"] * cfg.smoke, cwd=ROOT,
                           env={**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"the forced-AVX2 run of {groups} failed:\n{p.stderr[-4000:]}")
        with open(os.path.join(tmp, "results.json")) as f:
            child = json.load(f)
    assert child["machine"]["isa"]["path"] == "avx2", "the child did not run the AVX2 path"
    return {g: child[g] for g in groups}


def _merged(path: str, new: dict, groups: list[str]) -> dict:
    """The results in ``path`` with ``groups`` replaced by ``new``'s (and the machine
    limits, with the large operators that are read against them)."""
    with open(path) as f:
        results = json.load(f)
    extra = (["limits", "large_ops_avx2"] if "large_ops" in groups else []) + \
        [f"{g}_avx2" for g in AVX2_RERUN if g in groups and f"{g}_avx2" in new]
    for g in [*groups, *extra]:
        results[g] = new[g]
        results["group_elapsed_s"][g] = new["group_elapsed_s"].get(g)
    rerun = results.setdefault("rerun", [])
    rerun.append({"groups": groups, "date": new["machine"]["date"], "loadavg_start": new["machine"]["loadavg_start"],
                  "loadavg_end": new["loadavg_end"], "cpu_model": new["machine"]["cpu_model"]})
    return results


def write_report(results: dict, out: str) -> dict:
    plots = report.plots(results, out)
    with open(os.path.join(out, "RESULTS.md"), "w") as f:
        f.write(report.markdown(results, plots))
    print(f"wrote {out}/RESULTS.md and {len(plots)} plots")
    return results


if __name__ == "__main__":
    main()
