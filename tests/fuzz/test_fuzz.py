"""The differential fuzzer in CI: random programs on the CPU and on neuron,
per path, compared exactly (runner.py says how).

Seeds 0..N-1 of each path, so a CI failure reproduces with
``python -m tests.fuzz --path PATH --seed SEED``, which prints the minimised
program. TORCHNEURON_FUZZ_PROGRAMS=N runs N programs per eager path (and
N // 250 compiled ones) instead of CI's counts; TORCHNEURON_FUZZ_SEED=S starts
at seed S. Statements that known, reported findings would make fail are not
drawn (known_findings.py, each with its strict xfail in test_regressions.py);
the summary printed per path counts them.
"""
import collections
import os
import time

import pytest
import torch

import torchneuron

from . import known_findings, minimise, runner
from .generator import PROFILES, generate

# Programs per path in CI: about 70 s on 2 shared cores with a warm Inductor cache
# (compiled programs take seconds each to compile when the cache is cold). Each program runs once
# on the CPU and twice on neuron (runner.check says why).
CI_PROGRAMS = {"lean": 1200, "generic": 2000, "fused": 500, "compiled": 3}
REPORTED = 3  # failing programs minimised and printed per path


def programs(path: str) -> int:
    n = int(os.environ.get("TORCHNEURON_FUZZ_PROGRAMS", "0"))
    if not n:
        return CI_PROGRAMS[path]
    return max(1, n // 250) if path == "compiled" else n


@pytest.mark.parametrize("path", list(PROFILES))
def test_fuzz(path, capsys):
    first = int(os.environ.get("TORCHNEURON_FUZZ_SEED", "0"))
    count = programs(path)
    known_findings.used.clear()
    torchneuron.clear_op_tracking()
    runner.stats.clear()
    failures, kinds = [], collections.Counter()
    start = time.perf_counter()
    for seed in range(first, first + count):
        program = generate(seed, path)
        found = runner.check(program)
        if found:
            kinds[found[0].kind] += 1
            failures.append(program)
    fused_groups = torchneuron._C._fused_groups()
    summary = (f"fuzz {path}: {count} programs (seeds {first}..{first + count - 1}), "
               f"{time.perf_counter() - start:.1f} s, {dict(runner.stats)}; mismatches by class: {dict(kinds) or 'none'}; "
               f"not drawn or tolerated for known findings: {dict(known_findings.used) or 'none'}")
    if path == "fused":
        summary += f"; fused groups: {fused_groups}"
    with capsys.disabled():
        print("\n" + summary)
    if failures:
        reports = []
        for program in failures[:REPORTED]:
            small, mismatches = minimise.minimise(program)
            if path != "compiled" and any(m.kind == "error deferred" for m in mismatches):
                mismatches = runner.locate(small) or mismatches
            reports.append(minimise.report(small, mismatches, program))
        more = f"\n... and {len(failures) - REPORTED} more failing programs" if len(failures) > REPORTED else ""
        pytest.fail(f"{summary}\n\n" + "\n\n".join(reports) + more, pytrace=False)
    if path == "fused":
        assert fused_groups > count // 4, "the fused path hardly fused"
    torch.neuron.synchronize()


# Threaded mode: programs whose neuron runs happen at once, one host thread each (runner.check_threaded).
CI_THREADED = {"lean": 1200, "generic": 1200, "fused": 320}
THREADS = 4


@pytest.mark.parametrize("own_streams", [False, True], ids=["shared stream", "own streams"])
@pytest.mark.parametrize("path", list(CI_THREADED))
def test_fuzz_threaded(path, own_streams, capsys):
    first = int(os.environ.get("TORCHNEURON_FUZZ_SEED", "0"))
    count = int(os.environ.get("TORCHNEURON_FUZZ_PROGRAMS", "0")) or CI_THREADED[path]
    known_findings.used.clear()
    failing = {}
    start = time.perf_counter()
    for batch in range(first, first + count, THREADS):
        programs = [generate(seed, path) for seed in range(batch, min(batch + THREADS, first + count))]
        failing |= runner.check_threaded(programs, own_streams)
    with capsys.disabled():
        print(f"\nfuzz {path} in {THREADS} threads ({'own streams' if own_streams else 'shared stream'}): "
              f"{count} programs from seed {first}, {time.perf_counter() - start:.1f} s, "
              f"{len(failing)} failing")
    assert not failing, "\n".join(f"seed {seed}: " + "; ".join(map(str, ms[:3])) for seed, ms in list(failing.items())[:5])
    torch.neuron.synchronize()


def test_every_known_finding_has_its_strict_xfail():
    """Each finding the fuzzer leaves out names a regression test that exists and is a strict xfail,
    so that a fix shows (the test XPASSes and fails) and the finding's entry goes with it."""
    from . import test_regressions

    for finding in known_findings.FINDINGS:
        test = getattr(test_regressions, finding.regression_test, None)
        assert test is not None, f"{finding.name}: no {finding.regression_test} in test_regressions.py"
        marks = [m for m in getattr(test, "pytestmark", []) if m.name == "xfail"]
        assert marks and marks[0].kwargs.get("strict"), f"{finding.name}: {finding.regression_test} is no strict xfail"
    names = [f.name for f in known_findings.FINDINGS]
    assert len(names) == len(set(names))
