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

import os

import pytest

from lockin_testing import SETTINGS, SETTINGS_DIR, check_run, corpus_files, setting_runs

PROGRAMS = corpus_files(SETTINGS_DIR)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return setting_runs(tmp_path_factory.getbasetemp() / "setting_runs")[0]


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("name", [os.path.basename(p) for p in PROGRAMS])
def test_fixed_program_runs_where_the_original_ran(runs, setting, name):
    # every one of these programs runs on a CPU-only machine, on CUDA and (run mode) on neuron
    assert runs[setting][name]["original"]["exit"] == 0, runs[setting][name]["original"]["error"]
    assert check_run(runs, setting, name)
    if name == "device_type_compare.py" and setting == "neuron":
        # the fixed program prints what the original prints on CUDA, where the device exists
        assert runs[setting][name]["fixed"]["stdout"] == "False True\n"


def test_the_settings_differ_where_they_should(runs):
    """The settings are what they claim: no accelerator, neuron's two devices, one CUDA stand-in."""
    for setting, enabled in (("cpu", "False"), ("neuron", "True"), ("cuda", "True")):
        assert runs[setting]["amp_scaler.py"]["fixed"]["stdout"].startswith(enabled), setting
    assert runs["cpu"]["is_cuda.py"]["fixed"]["stdout"].startswith("host")
    assert runs["neuron"]["is_cuda.py"]["fixed"]["stdout"].startswith("accelerator")
    # the stand-in's accelerator is CUDA: a device named by its type is "cuda", redirected to the CPU
    assert runs["cuda"]["device_type_compare.py"]["fixed"]["stdout"] == "False False\n"
