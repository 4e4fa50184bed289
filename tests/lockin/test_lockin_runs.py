"""The corpus programs run: after --fix on ``neuron``, and unfixed under
``torchneuron-lockin run`` on ``neuron``, each gives what the original gives
on the CPU with CUDA mapped to the CPU (same seeds): losses equal, every
parameter and buffer bit for bit. All runs share one fresh interpreter
(corpus_runs.py); the redirection itself is also checked here, in this
process, for putting everything back."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from torchneuron.lockin import analyse_file
from torchneuron.lockin.fixer import fix_path
from torchneuron.lockin.redirect import Redirection
from torchneuron.lockin.report import Report

from lockin_testing import HERE, LABELLED, ROOT, corpus_files

WAYS = ("reference", "fixed", "run")

# a CUDA program whose device string is built at run time: no static finding can see it
RUNTIME_ONLY = textwrap.dedent("""
    import sys
    import torch
    kind = "".join(["cu", "da"])
    x = torch.ones(3, device=torch.device(kind))
    torch.cuda.synchronize()
    print(x.device)
""")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    fixed, out = base / "fixed", base / "out"
    fixed.mkdir()
    out.mkdir()
    programs = corpus_files(LABELLED)
    for p in programs:
        shutil.copy(p, fixed)
        fix, _ = fix_path(str(fixed / os.path.basename(p)), write=True)
        assert fix.not_applied == []
    script = base / "runtime_only.py"
    script.write_text(RUNTIME_ONLY)
    report = base / "runtime_only.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ROOT}
    p = subprocess.run([sys.executable, os.path.join(HERE, "corpus_runs.py"), str(out), str(fixed),
                        "--cli", str(script), str(report), *programs],
                       capture_output=True, text=True, env=env, timeout=600, cwd=str(base))
    assert p.returncode == 0, p.stderr[-4000:]
    with open(out / "runs.json") as f:
        ended = json.load(f)
    return out, ended, report, p.stderr


@pytest.mark.parametrize("name", [os.path.basename(p) for p in corpus_files(LABELLED)])
def test_fixed_and_run_mode_agree_with_the_cpu_reference(runs, name):
    out, ended, _, stderr = runs
    assert {w: ended[name][w]["exit"] for w in WAYS} == {w: 0 for w in WAYS}, stderr[-4000:]
    results = {w: json.load(open(out / name / w / "result.json")) for w in WAYS}
    models = {w: torch.load(out / name / w / "model.pt") for w in WAYS}
    assert results["reference"]["losses"], name
    for w in ("fixed", "run"):
        assert results[w]["losses"] == results["reference"]["losses"], (name, w)
        assert models[w].keys() == models["reference"].keys()
        for k, ref in models["reference"].items():
            assert models[w][k].dtype == ref.dtype and torch.equal(models[w][k], ref), (name, w, k)


@pytest.mark.parametrize("name", [os.path.basename(p) for p in corpus_files(LABELLED)])
def test_run_mode_sites_are_the_static_findings(runs, name):
    """Every line the run redirected holds a static finding or uses a literal one
    found: the corpus has no tie that only the run sees."""
    _, ended, _, _ = runs
    program = os.path.join(LABELLED, name)
    sites = [s for s in ended[name]["run"]["sites"] if s["path"] is not None]
    assert sites, name
    report = Report([analyse_file(program)])
    report.merge_runtime([{**s, "path": program} for s in sites])
    assert report.runtime_findings == [], [(f.line, f.message) for f in report.runtime_findings]
    assert report.runtime_confirmed


def test_the_run_mode_counts_a_device_built_at_run_time(runs):
    _, ended, report_path, _ = runs
    assert ended["cli_exit"] == 0
    report = json.load(open(report_path))
    runtime = [(f["line"], f["rule"]) for f in report["findings"] if f["origin"] == "runtime"]
    assert runtime == [(5, "TNL003")]
    static = {(f["line"], f["rule"]): f["seen_at_runtime"] for f in report["findings"] if f["origin"] == "static"}
    assert static == {(6, "TNL004"): True}
    assert report["summary"]["tying_lines"] == 2 and report["summary"]["runtime_only_lines"] == 1


def test_analysis_and_run_mode_do_not_import_libcst(runs):
    assert runs[1]["libcst_imported_by_runs"] is False


# -- the redirection, in this process ---------------------------------------------------------------

def _state():
    import torch.distributed as dist
    return (torch.cuda, sys.modules["torch.cuda"], sys.modules.get("torch.cuda.amp"), torch.autocast,
            torch.amp.autocast, torch.amp.GradScaler, torch.backends.cudnn, dist.init_process_group,
            threading.Thread.run, torch.nn.parallel.DistributedDataParallel,
            torch._C._len_torch_function_stack())


@pytest.mark.parametrize("target", ["neuron", "cpu"])
def test_redirection_redirects_records_and_puts_everything_back(target):
    before = _state()
    in_thread = {}
    with Redirection(target, [__file__]) as r:
        assert torch.cuda.is_available() and torch.cuda.device_count() >= 1
        x = torch.ones(2).cuda()
        y = torch.zeros(2, device="cuda:0")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            z = torch.mm(torch.ones(2, 2, device="cuda"), torch.ones(2, 2, device="cuda"))
        t = threading.Thread(target=lambda: in_thread.update(d=torch.ones(1, device="cuda").device))
        t.start()
        t.join()
        torch.cuda.synchronize()
    assert _state() == before
    assert x.device.type == y.device.type == z.device.type == in_thread["d"].type == target
    assert z.dtype == torch.bfloat16
    here = os.path.abspath(__file__)
    assert {s["path"] for s in r.sites} == {here}
    assert {s["rule"] for s in r.sites} == {"TNL001", "TNL003", "TNL004"}


def test_torch_keeps_the_real_torch_cuda_inside():
    from torch._utils import _get_available_device_type   # asks torch.cuda.is_available() first

    with Redirection("neuron", [__file__]) as r:
        program_sees = torch.cuda.is_available()
        torch_sees = _get_available_device_type()
    assert program_sees is True and torch_sees == "neuron"   # this build has no CUDA, and torch knows it
    assert [s["what"] for s in r.sites] == ["torch.cuda.is_available"]


def test_run_mode_redirects_load_generator_nccl_and_profiler(tmp_path):
    from torch.profiler import ProfilerActivity

    from torchneuron.lockin.redirect import _without_nccl
    from torchneuron.lockin.source import python_files

    path = tmp_path / "ck.pt"
    torch.save({"w": torch.ones(2)}, path)
    with Redirection("neuron", [__file__]) as r:
        a = torch.load(path, map_location="cuda")["w"]
        b = torch.load(path, map_location={"cpu": "cuda:1"})["w"]
        g = torch.Generator("cuda")
        assert isinstance(torch.default_generator, torch.Generator) and isinstance(g, torch.Generator)
        with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            pass
    assert (a.device, b.device, g.device) == (torch.device("neuron", 0), torch.device("neuron", 1),
                                              torch.device("neuron", 0))
    assert ProfilerActivity.CUDA not in prof.activities and ProfilerActivity.PrivateUse1 in prof.activities
    assert {s["to"] for s in r.sites} >= {"neuron", "{'cpu': 'neuron:1'}"}
    assert [s["rule"] for s in r.sites if "profile" in s["what"]] == ["TNL023"]
    assert _without_nccl("nccl", "neuron", "neuron") == "neuron"
    assert _without_nccl("cpu:gloo,cuda:nccl", "neuron", "neuron") == "cpu:gloo,neuron:neuron"
    assert _without_nccl("cpu:gloo,cuda:nccl", "gloo", "cpu") == "cpu:gloo"
    # run --program . names the script's folder: the script is analysed once
    assert python_files([__file__, os.path.dirname(__file__)]).count(__file__) == 1
