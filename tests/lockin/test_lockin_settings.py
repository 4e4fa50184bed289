"""Each rewrite of ``--fix`` runs where the original ran: small programs, one per
pattern that --fix used to break without an accelerator (a device default, an
``is_cuda`` test, seeds and ``empty_cache``, GradScaler and autocast, a
DataParallel guard, ``.cuda(device)``, ``torch.load(map_location=...)``;
corpus/settings/), run original and fixed in three settings (setting_runs.py):
a machine without an accelerator (the neuron device hidden by
TORCH_DEVICE_BACKEND_AUTOLOAD=0, torchneuron never imported), ``neuron``, and a
CUDA stand-in (``torch.cuda`` and ``torch.accelerator`` report a CUDA device,
the work runs on the CPU, as in the run mode's reference). Where the original
runs, the fixed program runs and prints the same."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from torchneuron.lockin import analyse_file
from torchneuron.lockin.fixer import fix_path

from lockin_testing import CORPUS, HERE, ROOT, corpus_files

SETTINGS_DIR = os.path.join(CORPUS, "settings")
PROGRAMS = corpus_files(SETTINGS_DIR)
SETTINGS = ("cpu", "neuron", "cuda")


@pytest.fixture(scope="module")
def fixed_dir(tmp_path_factory):
    fixed = tmp_path_factory.mktemp("fixed")
    for p in PROGRAMS:
        shutil.copy(p, fixed)
        fix, _ = fix_path(str(fixed / os.path.basename(p)), write=True)
        assert fix.not_applied == [] and fix.changed, p
        assert [f for f in analyse_file(str(fixed / os.path.basename(p))).findings if f.fixable] == []
    return fixed


@pytest.fixture(scope="module")
def runs(fixed_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("settings")
    procs = {}
    for setting in SETTINGS:
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + HERE}
        if setting == "cpu":
            env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        procs[setting] = subprocess.run(
            [sys.executable, os.path.join(HERE, "setting_runs.py"), setting, str(out / f"{setting}.json"),
             str(fixed_dir), *PROGRAMS], capture_output=True, text=True, env=env, timeout=600, cwd=str(out))
    results = {}
    for setting, p in procs.items():
        assert p.returncode == 0, (setting, p.stderr[-4000:])
        with open(out / f"{setting}.json") as f:
            results[setting] = json.load(f)
    return results


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("name", [os.path.basename(p) for p in PROGRAMS])
def test_fixed_program_runs_where_the_original_ran(runs, setting, name):
    original, fixed = runs[setting][name]["original"], runs[setting][name]["fixed"]
    # every one of these programs runs on a CPU-only machine, on CUDA and (run mode) on neuron
    assert original["exit"] == 0, original["error"]
    assert fixed["exit"] == 0, fixed["error"]
    if name == "device_type_compare.py" and setting != "cpu":
        # neither redirection can reach a comparison of a string with "cuda": the original
        # prints what no CUDA machine would (its tensor on neuron or the CPU is not "cuda");
        # the fixed program prints what the original prints on CUDA, where the device exists.
        # The CUDA stand-in computes on the CPU, so there its accelerator's tensors and the
        # host's are alike: only that it runs is checked.
        if setting == "neuron":
            assert fixed["stdout"] == "False True\n"
        return
    assert fixed["stdout"] == original["stdout"]


def test_the_settings_differ_where_they_should(runs):
    """The settings are what they claim: no accelerator, neuron's two devices, one CUDA stand-in."""
    for setting, enabled in (("cpu", "False"), ("neuron", "True"), ("cuda", "True")):
        assert runs[setting]["amp_scaler.py"]["fixed"]["stdout"].startswith(enabled), setting
    assert runs["cpu"]["is_cuda.py"]["fixed"]["stdout"].startswith("host")
    assert runs["neuron"]["is_cuda.py"]["fixed"]["stdout"].startswith("accelerator")
    assert runs["cuda"]["is_cuda.py"]["fixed"]["stdout"].startswith("accelerator")
