"""Runs the fuzzer from the command line.

    python -m tests.fuzz --path generic --seed 123        one program: its mismatches, minimised
    python -m tests.fuzz --path generic --programs 5000   many, in child processes (a crash or a hang
                                                          is a finding that names its seed); each class
                                                          of mismatch minimised once, into --out
    python -m tests.fuzz --path generic --programs 5000 --threads 4
                                                          many, four at a time in host threads (on one
                                                          stream, then a stream each), in this process
Run it under `nice -n 15` on a shared machine.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict

from . import generator, known_findings, minimise, runner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def one(path: str, seed: int, show: bool) -> int:
    program = generator.generate(seed, path)
    found = runner.check(program)
    if show:
        print(program.source())
    if not found:
        print(f"path {path}, seed {seed}: no mismatch")
        return 0
    small, mismatches = minimise.minimise(program)
    if program.path != "compiled" and any(m.kind == "error deferred" for m in mismatches):
        mismatches = runner.locate(small) or mismatches
    print(minimise.report(small, mismatches, program))
    return 1


def chunk(path: str, first: int, count: int, log: str) -> int:
    """Child process: programs first..first+count-1, one JSON line each (and one before each, so
    that a crash names its seed)."""
    with open(log, "a") as f:
        for seed in range(first, first + count):
            f.write(json.dumps({"start": seed}) + "\n")
            f.flush()
            known_findings.hits.clear()
            program = generator.generate(seed, path)
            try:
                found = runner.check(program)
            except Exception as e:  # noqa: BLE001 - the runner itself failing is a finding too
                found = [runner.Mismatch("runner error", "", f"{type(e).__name__}: {e}")]
            f.write(json.dumps({"seed": seed, "mismatches": [[m.kind, m.where, m.detail] for m in found],
                                "findings": sorted(set(known_findings.hits))}) + "\n")
        f.write(json.dumps({"stats": dict(runner.stats), "known": dict(known_findings.used)}) + "\n")
    return 0


def signature(kind: str, detail: str) -> str:
    """A class of mismatch: its kind and its detail without numbers and names."""
    detail = re.sub(r"\b[xv]\d+\b", "V", detail)
    detail = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "N", detail)
    return f"{kind}: {detail[:160]}"


def many(path: str, first: int, count: int, out: str, per_child: int, timeout: float) -> int:
    os.makedirs(out, exist_ok=True)
    log = os.path.join(out, f"{path}.jsonl")
    open(log, "w").close()
    seed, done, met, started = first, {}, {}, time.time()
    crashes, stats, known = [], defaultdict(int), defaultdict(int)
    while seed < first + count:
        n = min(per_child, first + count - seed)
        cmd = [sys.executable, "-m", "tests.fuzz", "--path", path, "--chunk", str(seed), str(n), "--log", log]
        try:
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
            status = r.returncode
        except subprocess.TimeoutExpired:
            status = "timeout"
        last_start = None
        with open(log) as f:
            for line in f:
                rec = json.loads(line)
                if "start" in rec:
                    last_start = rec["start"]
                elif "seed" in rec:
                    done[rec["seed"]] = rec["mismatches"]
                    met[rec["seed"]] = rec["findings"]
                elif "stats" in rec:
                    for k, v in rec["stats"].items():
                        stats[k] += v
                    for k, v in rec["known"].items():
                        known[k] += v
        open(log, "w").close()
        if status != 0:  # the child died (a crash, an abort) or hung at last_start
            crashes.append({"seed": last_start, "status": status})
            done[last_start] = [["crash" if status != "timeout" else "hang", "", f"child status {status}"]]
            seed = last_start + 1
        else:
            seed += n
        print(f"[fuzz {path}] {len(done)}/{count} programs, {sum(bool(m) for m in done.values())} failing, "
              f"{time.time() - started:.0f} s", flush=True)
    classes = defaultdict(list)
    for s, found in sorted(done.items()):
        if found:
            kind, where, detail = found[0]
            # with TORCHNEURON_FUZZ_RAW=1, a failing program is counted under the known findings it met
            cause = " + ".join(met.get(s, [])) if known_findings.RAW and met.get(s) else signature(kind, detail)
            classes[cause].append(s)
    summary = {"path": path, "programs": count, "first seed": first, "seconds": round(time.time() - started),
               "failing programs": sum(bool(m) for m in done.values()), "stats": dict(stats), "known": dict(known),
               "classes": {k: v for k, v in sorted(classes.items(), key=lambda kv: -len(kv[1]))}}
    with open(os.path.join(out, f"{path}.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(out, f"{path}.md"), "w") as f:
        f.write(f"# fuzz {path}: {count} programs from seed {first}, {summary['failing programs']} failing\n\n")
        for sig, seeds in summary["classes"].items():
            f.write(f"## {len(seeds)} x {sig}\n\nseeds {seeds[:20]}\n\n")
            if sig.startswith(("crash", "hang")):
                continue
            cmd = [sys.executable, "-m", "tests.fuzz", "--path", path, "--seed", str(seeds[0])]
            try:
                r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
                f.write("```\n" + r.stdout.strip() + "\n```\n\n")
            except subprocess.TimeoutExpired:
                f.write("(minimising timed out)\n\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "classes"}, indent=1))
    print(f"{len(classes)} classes of mismatch; minimised programs in {os.path.join(out, path + '.md')}")
    return 1 if classes else 0


def threaded(path: str, first: int, count: int, threads: int) -> int:
    """Programs run `threads` at a time, one host thread each (runner.check_threaded), on a shared
    stream and on a stream each, in this process; the failing seeds and their first mismatches."""
    failing, started = {}, time.time()
    for own in (False, True):
        for batch in range(first, first + count, threads):
            programs = [generator.generate(s, path) for s in range(batch, min(batch + threads, first + count))]
            for seed, found in runner.check_threaded(programs, own).items():
                failing[(seed, own)] = [str(m) for m in found[:3]]
            print(f"[fuzz {path}, {threads} threads, {'own streams' if own else 'shared stream'}] "
                  f"{min(batch + threads, first + count) - first}/{count} programs, {len(failing)} failing, "
                  f"{time.time() - started:.0f} s", flush=True)
    for (seed, own), found in failing.items():
        print(f"seed {seed} ({'own streams' if own else 'shared stream'}): {'; '.join(found)}")
    return 1 if failing else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", choices=list(generator.PROFILES), default="generic")
    parser.add_argument("--seed", type=int, help="run this one program, and minimise it if it fails")
    parser.add_argument("--show", action="store_true", help="with --seed: print the whole program first")
    parser.add_argument("--programs", type=int, help="run this many programs")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--out", default="fuzz-results", help="with --programs: where the findings go")
    parser.add_argument("--per-child", type=int, default=250, help="programs per child process")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a child may take")
    parser.add_argument("--threads", type=int, help="with --programs: run them this many at a time, in threads")
    parser.add_argument("--chunk", type=int, nargs=2, metavar=("FIRST", "COUNT"), help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.chunk:
        return chunk(args.path, args.chunk[0], args.chunk[1], args.log)
    if args.seed is not None:
        return one(args.path, args.seed, args.show)
    if args.programs and args.threads:
        return threaded(args.path, args.first_seed, args.programs, args.threads)
    if args.programs:
        return many(args.path, args.first_seed, args.programs, args.out, args.per_child, args.timeout)
    parser.error("give --seed or --programs")
    return 2


if __name__ == "__main__":
    sys.exit(main())
