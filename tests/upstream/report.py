"""REPORT.md of an upstream run, and the run's problems (what fails CI)."""
import collections
import datetime
import fnmatch

from tests.upstream import compat, fetch, lists
from tests.upstream.runner import classify

COLUMNS = ["pass", "neuron_only", "known", "neuron_skipped", "skipped_list", "skipped_test", "cpu_fails"]


def _verdicts(files):
    """{file: {id: verdict}}, known defects told apart from other neuron-only failures."""
    out = {}
    for f, r in files.items():
        v = {}
        for tid, res in r["results"].items():
            if tid.startswith("__"):
                continue
            # The lists as they are now, also for a saved run re-rendered with --from-json.
            k = "skipped_list" if lists.skip_reason(tid) else classify(res)
            if k == "neuron_only" and lists.known_defect(tid):
                k = "known"
            v[tid] = k
        out[f] = v
    return out


def problems(files):
    """What fails the run: unlisted neuron-only failures, files that did not run,
    list entries that match no test, known defects whose tests now pass."""
    out = []
    verdicts = _verdicts(files)
    for f, r in files.items():
        for key in ("__import__", "__worker__"):
            if key in r["results"]:
                out.append(f"{f}: {r['results'][key]['error']}")
        for tid, k in verdicts[f].items():
            if k == "neuron_only":
                out.append(f"neuron-only failure: {tid}: {r['results'][tid]['neuron']['detail']}")
            elif k == "neuron_skipped" and lists.own_skip_cause(tid, r["results"][tid]["neuron"]["detail"]) is None:
                out.append(f"skipped by the test on neuron only, with a message lists.SKIPPED_BY_TEST does not "
                           f"explain (it may hide a test other accelerators run): {tid}: "
                           f"{r['results'][tid]['neuron']['detail']}")
        plan = r.get("plan") or {}
        for p in plan.get("unmatched", []):
            out.append(f"list entry matches no test of {f} (stale, or the test was renamed): {p}")
    # A known-defect entry is honest while at least one of its tests that ran still fails
    # on neuron only; an entry none of whose tests ran (other files, a partial run) is not judged.
    for pattern, desc, issue in lists.KNOWN_DEFECTS:
        ran = [(f, tid) for f in verdicts for tid, k in verdicts[f].items() if fnmatch.fnmatchcase(tid, pattern)]
        if ran and not any(verdicts[f][tid] == "known" for f, tid in ran):
            states = collections.Counter(verdicts[f][tid] for f, tid in ran)
            out.append(f"known defect no longer fails on neuron only ({dict(states)}), remove it: {pattern} "
                       f"({desc}, issue {issue})")
    return out


def summary_line(files, wall):
    c = collections.Counter(k for v in _verdicts(files).values() for k in v.values())
    return (f"upstream: {sum(c.values())} tests run on cpu and neuron in {wall:.0f} s: {c['pass']} pass on both, "
            f"{c['neuron_only']} neuron-only failures, {c['known']} known defects, {c['skipped_list']} skipped by list, "
            f"{c['cpu_fails']} fail on the CPU too")


def write(files, wall, full, jobs, path, cpu=None, scale=1):
    verdicts = _verdicts(files)
    probs = problems(files)
    L = []
    w = L.append
    w("# PyTorch's own test files on `neuron`\n")
    w("Written by every run of `tests/upstream/runner.py`: CI's is `tests/upstream/test_upstream.py` "
      "(`scripts/test.sh tests/upstream`), which writes this file from the fixed sample; "
      "`PYTHONPATH=. .venv/bin/python -m tests.upstream.runner [--report PATH]` runs it directly, "
      "`TORCHNEURON_UPSTREAM=full` runs the files whole, `TORCHNEURON_UPSTREAM_SAMPLE_SCALE=N` takes N times "
      "the sample. How it works: [runner.py](runner.py); what is not held against `neuron`: [lists.py](lists.py).\n")
    mode = ("full (every test of each file)" if full else
            "sample (fixed per file, runner.SAMPLE" + (f", times {scale:g}: TORCHNEURON_UPSTREAM_SAMPLE_SCALE" if scale != 1
                                                        else "") + ")")
    w(f"- Test files: Debian's `pytorch` source package {fetch.version()} (upstream PyTorch "
      f"{fetch.upstream_version()}'s `test/`), run against this PyTorch's `torch.testing._internal`.")
    cpu_txt = f", CPU time of the workers {cpu:.0f} s" if cpu is not None else ""
    one_sided = sum((r.get("plan") or {}).get("one_sided", 0) for r in files.values())
    w(f"- Mode: {mode}; {jobs} worker processes at a time; wall time **{wall:.0f} s**{cpu_txt}; "
      f"{datetime.date.today().isoformat()}.")
    w(f"- Tests instantiated for one of the two devices only (e.g. `only_for=\"cpu\"` classes), not compared: "
      f"{one_sided}.")
    w("- Each test runs on `cpu`, then on `neuron` (the device synchronised after it and its errors charged "
      "to it). A test counts against `neuron` only when it passes on the CPU.\n")
    w("| file | tests (pairs) | selected | pass on CPU | pass on neuron | neuron-only failures | known defects "
      f"(issue {lists.ISSUE}) | skipped by list | skipped by the test on both | skipped by the test on neuron only "
      "| fail on the CPU too | seconds |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|")
    tot = collections.Counter()
    for f, r in files.items():
        plan = r.get("plan") or {}
        v = verdicts[f]
        c = collections.Counter(v.values())
        res = [x for t, x in r["results"].items() if not t.startswith("__")]
        cpu_pass = sum(1 for x in res if "cpu" in x and x["cpu"]["status"] == "pass")
        neu_pass = sum(1 for x in res if "neuron" in x and x["neuron"]["status"] == "pass")
        row = dict(total=plan.get("total", 0), run=len(res), cpu=cpu_pass, neu=neu_pass, only=c["neuron_only"],
                   known=c["known"], sl=c["skipped_list"], st=c["skipped_test"], ns=c["neuron_skipped"],
                   cf=c["cpu_fails"], s=r["seconds"])
        tot.update(row)
        broken = " (did not run: see problems)" if not plan else ""
        w(f"| {f}{broken} | {row['total']} | {row['run']} | {cpu_pass} | {neu_pass} | {row['only']} | {row['known']} "
          f"| {row['sl']} | {row['st']} | {row['ns']} | {row['cf']} | {row['s']:.0f} |")
    w(f"| **all** | {tot['total']} | {tot['run']} | {tot['cpu']} | {tot['neu']} | {tot['only']} | {tot['known']} "
      f"| {tot['sl']} | {tot['st']} | {tot['ns']} | {tot['cf']} | {tot['s']:.0f} (summed) |")
    w("")
    w("## Problems (each fails CI)\n")
    w("\n".join(f"- {p}" for p in probs) if probs else "None.")
    w("")
    w(f"## Known defects seen in this run (issue {lists.ISSUE})\n")
    seen = collections.defaultdict(list)
    for f, v in verdicts.items():
        for tid, k in v.items():
            if k == "known":
                seen[lists.known_defect(tid)[0]].append(tid)
    for pattern, desc, issue in lists.KNOWN_DEFECTS:
        ids = sorted(seen.get(pattern, []))
        eg = (": " + ", ".join(f"`{i.split('::')[-1]}`" for i in ids[:4]) + (", ..." if len(ids) > 4 else "")) if ids else ""
        w(f"- `{pattern}`: {desc} (issue {issue}): {len(ids)} failing in this run{eg}")
    w("")
    w("## Skipped by list, by cause\n")
    for cause, entries in lists.SKIPS.items():
        n = sum(1 for v in verdicts.values() for tid, k in v.items()
                if k == "skipped_list" and lists.skip_reason(tid).startswith(cause + ":"))
        w(f"- {cause}: {len(entries)} entries, {n} tests in this run")
    w("")
    w("## Skipped by the test itself on `neuron` only (CPU passes)\n")
    w("The upstream test's own decorator skips it on `neuron`; grouped by the skip's message, then by why the "
      "test is written so ([lists.py](lists.py), SKIPPED_BY_TEST). A message not listed there fails CI.\n")
    groups = collections.defaultdict(collections.Counter)
    unread = collections.defaultdict(list)
    for f, r in files.items():
        for tid, k in verdicts[f].items():
            if k != "neuron_skipped":
                continue
            message = r["results"][tid]["neuron"]["detail"]
            decorator, why = lists.own_skip_cause(tid, message) or (f"not explained: `{message[:120]}`", None)
            groups[decorator][why] += 1
            if why is None:
                unread[decorator].append(tid)
    for decorator, whys in groups.items():
        w(f"- {decorator}: {sum(whys.values())}")
        for why, n in whys.most_common():
            if why is not None:
                w(f"  - {n}: {why}")
        if unread[decorator]:
            ids = sorted(unread[decorator])
            w(f"  - {len(ids)}: not yet read: " + ", ".join(f"`{i}`" for i in ids[:6]) + (", ..." if len(ids) > 6 else ""))
    w("")
    w("## How the `neuron` classes are instantiated ([instantiation.py](instantiation.py))\n")
    adjusted, widened = {}, 0
    for r in files.values():
        plan = r.get("plan") or {}
        widened += plan.get("widened", 0)
        for what, why in plan.get("adjusted", []):
            adjusted[what] = why
    for what, why in adjusted.items():
        w(f"- `{what}`: {why}")
    w(f"- tests given the CUDA list's dtypes in these files: {widened}")
    w("")
    w("## Failing on the CPU too (not counted: mostly the version gap between the test files and this PyTorch)\n")
    reasons = collections.Counter()
    for f, r in files.items():
        for tid, k in verdicts[f].items():
            if k == "cpu_fails":
                reasons[(f, r["results"][tid]["cpu"]["detail"][:140])] += 1
    for (f, reason), n in reasons.most_common(25):
        w(f"- {f}: {n}: `{reason}`")
    w("")
    w("## Compatibility shims ([compat.py](compat.py))\n")
    provided = {}
    for r in files.values():
        for m, n, why in (r.get("plan") or {}).get("provided", []):
            provided[(m, n)] = why
    for (m, n), why in sorted(provided.items()):
        w(f"- `{m}.{n}`: {why}")
    w("")
    open(path, "w").write("\n".join(L))
    return probs
