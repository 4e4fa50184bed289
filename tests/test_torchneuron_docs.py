"""Programs written the way AWS's TorchNeuron documentation writes them (tests/torchneuron_docs/:
the first-model quickstart in eager, compiled and mixed mode, the NKI quickstart, memory profiling,
profiling, the distributed tutorial), each run unchanged in a fresh interpreter. Each program checks
its own results against the CPU and ends by printing OK."""
import pathlib
import re
import sys

import pytest

CORPUS = pathlib.Path(__file__).parent / "torchneuron_docs"
SINGLE = ["eager_quickstart", "compile_quickstart", "mixed_mode", "nki_quickstart", "memory_profiling", "profiling"]


def _run(args, tmp_path, timeout=300):
    import subprocess

    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


@pytest.mark.parametrize("program", SINGLE)
def test_documented_program_runs_unchanged(program, tmp_path):
    r = _run([str(CORPUS / f"{program}.py"), str(tmp_path)], tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert r.stdout.strip().splitlines()[-1].startswith("OK "), r.stdout


def test_distributed_tutorial_runs_unchanged_under_torchrun(tmp_path):
    r = _run(["-m", "torch.distributed.run", "--nproc-per-node=2", str(CORPUS / "distributed_tutorial.py")], tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    # the ranks' lines may interleave in the launcher's output
    assert sorted(re.findall(r"OK distributed tutorial rank \d", r.stdout)) == [
        "OK distributed tutorial rank 0", "OK distributed tutorial rank 1"]


def test_every_program_in_the_corpus_is_run():
    assert sorted(p.stem for p in CORPUS.glob("*.py")) == sorted(SINGLE + ["distributed_tutorial"])
