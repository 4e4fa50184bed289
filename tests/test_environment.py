"""TorchNeuron's environment variables with TorchNeuron's meaning
(torchneuron/environment.py, docs/environment.md): the logical NeuronCore
configuration and the core count as the Neuron runtime reads them (device count,
memory per device, cores per device), their conflicts and malformed values; the
registry (defaults, flag/value, the start-up check: a malformed value fails the
import naming it, an unknown name warns once); TORCH_NEURONX_LOG_LEVEL; and the
registry and docs/environment.md list the same variables."""
import json
import os
import re

import pytest

from neuron_testing import ROOT, run_python
from torchneuron import environment
from torchneuron.environment import REGISTRY, ConfigError

GiB = 1 << 30
HOST = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
# Unset in every child unless a test sets them: the runtime's own settings.
RUNTIME_SETTINGS = ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", "NEURON_LOGICAL_NC_CONFIG",
                    "NEURON_RT_VIRTUAL_CORE_SIZE", "TORCHNEURON_MACHINE", "TORCHNEURON_HBM_BYTES")

DEVICES = """
import json, torch
from torchneuron import _C
n = torch.neuron.device_count()
p = [torch.neuron.get_device_properties(i) for i in range(n)]
c = _C._runtime_config()
print(json.dumps({"count": n, "lnc": [x.logical_nc_config for x in p], "memory": [x.total_memory for x in p],
                  "cores_per_device": [x.cores_per_device for x in p], "core_ids": [x.core_id for x in p],
                  "per_logical_core": c["hbm_bytes_per_logical_core"], "visible": c["visible_cores"]}))
"""


def devices(env):
    r = run_python(DEVICES, env=env, unset=RUNTIME_SETTINGS)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("machine, per_core, cores, default_lnc", [
    ("trn2", 12 * GiB, 8, 2), ("trn3", 18 * GiB, 8, 2), ("trn1", 16 * GiB, 2, 1)])
@pytest.mark.parametrize("lnc", [None, "1", "2"])
def test_a_device_is_a_logical_core(machine, per_core, cores, default_lnc, lnc):
    if machine == "trn1" and lnc == "2":
        pytest.skip("trn1 has no LNC=2 (test_malformed_core_settings_are_refused_at_the_first_device_use)")
    env = {"TORCHNEURON_MACHINE": machine} | ({"NEURON_LOGICAL_NC_CONFIG": lnc} if lnc else {})
    d = devices(env)
    expected_lnc = int(lnc) if lnc else default_lnc
    assert d["count"] == 2 and d["lnc"] == [expected_lnc] * 2  # the default set of cores at any LNC
    assert d["per_logical_core"] == per_core * expected_lnc
    assert d["memory"] == [min(per_core * expected_lnc, HOST // 2 // 2)] * 2  # within the host's share
    assert d["cores_per_device"] == [cores // expected_lnc] * 2  # a Trainium2 device shows 4 cores at LNC=2


def test_lnc_changes_what_one_device_holds():
    # Differential: one device of LNC=2 is two of LNC=1 (memory per device, cores per Trainium device).
    one, two = devices({"NEURON_LOGICAL_NC_CONFIG": "1"}), devices({"NEURON_LOGICAL_NC_CONFIG": "2"})
    assert two["per_logical_core"] == 2 * one["per_logical_core"] == 24 * GiB
    assert one["cores_per_device"] == [8, 8] and two["cores_per_device"] == [4, 4]
    # the older name means the same
    assert devices({"NEURON_RT_VIRTUAL_CORE_SIZE": "1"}) == one
    assert devices({"NEURON_RT_VIRTUAL_CORE_SIZE": "2", "NEURON_LOGICAL_NC_CONFIG": "2"}) == two


def test_num_cores_claims_that_many_logical_cores():
    d = devices({"NEURON_RT_NUM_CORES": "4"})
    assert d["count"] == 4 and d["core_ids"] == d["visible"] == [0, 1, 2, 3]
    assert d["memory"] == [min(24 * GiB, HOST // 2 // 4)] * 4
    # 0 is the runtime's default ("all"): here the default set
    assert devices({"NEURON_RT_NUM_CORES": "0"})["count"] == 2
    # as in AWS's launch lines: the size under its older name, the count in logical cores
    d = devices({"NEURON_RT_NUM_CORES": "3", "NEURON_RT_VIRTUAL_CORE_SIZE": "2"})
    assert d["count"] == 3 and d["lnc"] == [2, 2, 2]
    # a whole instance at LNC=1 is 128 cores, of which a process takes at most 64
    assert devices({"NEURON_RT_NUM_CORES": "64", "NEURON_LOGICAL_NC_CONFIG": "1"})["count"] == 64


def test_visible_cores_take_precedence_over_num_cores_with_a_warning():
    r = run_python(DEVICES, env={"NEURON_RT_VISIBLE_CORES": "1-3", "NEURON_RT_NUM_CORES": "2"}, unset=RUNTIME_SETTINGS)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["count"] == 3 and d["core_ids"] == [1, 2, 3]
    assert r.stderr.count("NEURON_RT_NUM_CORES is ignored: NEURON_RT_VISIBLE_CORES is set") == 1, r.stderr


def test_visible_core_ids_are_logical():
    # 64 logical cores at LNC=2 (ids 0-63), 128 at LNC=1
    assert devices({"NEURON_RT_VISIBLE_CORES": "100", "NEURON_LOGICAL_NC_CONFIG": "1"})["core_ids"] == [100]
    assert devices({"NEURON_RT_VISIBLE_CORES": "63"})["core_ids"] == [63]


BAD_CORE_SETTINGS = [
    ({"NEURON_LOGICAL_NC_CONFIG": "3"}, "NEURON_LOGICAL_NC_CONFIG='3' is invalid: expected 1 or 2"),
    ({"NEURON_LOGICAL_NC_CONFIG": "two"}, "NEURON_LOGICAL_NC_CONFIG='two' is invalid: expected 1 or 2"),
    ({"NEURON_RT_VIRTUAL_CORE_SIZE": "4"}, "NEURON_RT_VIRTUAL_CORE_SIZE='4' is invalid: expected 1 or 2"),
    ({"NEURON_LOGICAL_NC_CONFIG": "2", "TORCHNEURON_MACHINE": "trn1"},
     "NEURON_LOGICAL_NC_CONFIG='2' is invalid: trn1 (NeuronCore-v2) supports only 1"),
    ({"NEURON_LOGICAL_NC_CONFIG": "2", "NEURON_RT_VIRTUAL_CORE_SIZE": "1"},
     "NEURON_RT_VIRTUAL_CORE_SIZE='1' is invalid: it contradicts NEURON_LOGICAL_NC_CONFIG='2'"),
    ({"NEURON_RT_NUM_CORES": "abc"}, "NEURON_RT_NUM_CORES='abc' is invalid: expected a whole number"),
    ({"NEURON_RT_NUM_CORES": "-1"}, "NEURON_RT_NUM_CORES='-1' is invalid: expected a whole number"),
    ({"NEURON_RT_NUM_CORES": "65"}, "NEURON_RT_NUM_CORES='65' is invalid: 65 cores requested, the emulated instance has 64 logical NeuronCores at "
                                    "NEURON_LOGICAL_NC_CONFIG=2"),
    ({"NEURON_RT_NUM_CORES": "65", "NEURON_LOGICAL_NC_CONFIG": "1"},
     "NEURON_RT_NUM_CORES='65' is invalid: 65 cores requested, at most 64 are supported"),
    # checked even though NEURON_RT_VISIBLE_CORES wins
    ({"NEURON_RT_NUM_CORES": "x", "NEURON_RT_VISIBLE_CORES": "0"}, "NEURON_RT_NUM_CORES='x' is invalid"),
    ({"NEURON_RT_VISIBLE_CORES": "64"}, "NEURON_RT_VISIBLE_CORES='64' is invalid: core id 64 is above 63"),
]


@pytest.mark.parametrize("env, why", BAD_CORE_SETTINGS, ids=[",".join(f"{k}={v}" for k, v in e.items())
                                                              for e, _ in BAD_CORE_SETTINGS])
def test_malformed_core_settings_are_refused_at_the_first_device_use(env, why):
    r = run_python("""
        import torch
        print("available", torch.neuron.is_available(), flush=True)
        torch.zeros(1, device="neuron")
        """, env=env, unset=RUNTIME_SETTINGS)
    assert "available False" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 1 and "RuntimeError: " + why in r.stderr, r.stderr


def test_launch_blocking_takes_the_runtimes_booleans():
    code = "import torch; from torchneuron import _C; print(_C._launch_blocking())"
    for text, on in (("true", True), ("TRUE", True), ("1", True), ("false", False), ("0", False)):
        r = run_python(code, env={"NEURON_LAUNCH_BLOCKING": text})
        assert r.stdout.strip() == str(on), (text, r.stderr)


# ------------------------------------------------------------------ the registry
@pytest.mark.parametrize("var", [v for v in REGISTRY if v.default is not None], ids=lambda v: v.name)
def test_every_documented_default_parses(var):
    var.parse(var.default)


def test_the_runtime_takes_its_documented_defaults():
    # Differential: each runtime setting set to its documented default changes nothing.
    defaults = {v.name: v.default for v in REGISTRY if v.reader == "runtime" and v.default is not None}
    assert {"NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", "NEURON_LAUNCH_BLOCKING", "TORCHNEURON_MACHINE",
            "TORCHNEURON_EXIT_TIMEOUT"} <= set(defaults)
    code = DEVICES + "\nprint(_C._launch_blocking())"
    unset, explicit = (run_python(code, env=e, unset=RUNTIME_SETTINGS) for e in ({}, defaults))
    assert unset.returncode == explicit.returncode == 0, unset.stderr + explicit.stderr
    assert unset.stdout == explicit.stdout


def test_flag_and_value(monkeypatch):
    name = "TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY"
    monkeypatch.delenv(name, raising=False)
    assert environment.flag(name) is False
    for text, on in (("1", True), ("TRUE", True), ("false", False), ("0", False), ("", False)):
        monkeypatch.setenv(name, text)
        assert environment.flag(name) is on, text
    monkeypatch.setenv(name, "maybe")
    with pytest.raises(ConfigError, match=f"{name}='maybe' is invalid: expected 1, true or yes"):
        environment.flag(name)
    assert environment.flag("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION") is True  # its documented default
    monkeypatch.delenv("TORCH_NEURONX_DEBUG_DIR", raising=False)
    assert environment.value("TORCH_NEURONX_DEBUG_DIR") == "/tmp/neuron_backend"
    monkeypatch.setenv("TORCH_NEURONX_LOG_LEVEL", "debug")
    assert environment.value("TORCH_NEURONX_LOG_LEVEL") == 3
    monkeypatch.setenv("COLLECTIVE_BUCKETSIZE_IN_MB", "0")
    with pytest.raises(ConfigError, match="COLLECTIVE_BUCKETSIZE_IN_MB='0' is invalid: expected a whole number from 1"):
        environment.value("COLLECTIVE_BUCKETSIZE_IN_MB")
    # families, and the runtime's settings answer what the runtime made of them
    assert environment.variable("NEURON_RT_INSPECT_ENABLE").name == "NEURON_RT_INSPECT_ENABLE"
    assert environment.variable("NEURON_RT_INSPECT_CPU_UTIL").name == "NEURON_RT_INSPECT_*"
    assert environment.value("NEURON_LOGICAL_NC_CONFIG") == 2  # trn2's default
    with pytest.raises(TypeError, match="TORCH_NEURONX_DEBUG_DIR is not an on/off setting"):
        environment.flag("TORCH_NEURONX_DEBUG_DIR")
    with pytest.raises(KeyError, match="did you mean TORCH_NEURONX_LOG_LEVEL"):
        environment.value("TORCH_NEURONX_LOG_LEVL")


def test_an_unknown_variable_warns_once_naming_it_and_the_closest_known_one():
    r = run_python("import torch, torchneuron, torch_neuronx; print(torch.ones(1, device='neuron').item())",
                   env={"TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCPY": "1", "NEURON_RT_FOO": "1"})
    assert r.returncode == 0 and r.stdout.strip() == "1.0", r.stderr
    assert r.stderr.count("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCPY is set but is not a variable") == 1, r.stderr
    assert "(did you mean TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY?)" in r.stderr
    assert r.stderr.count("NEURON_RT_FOO is set but is not a variable") == 1, r.stderr
    # known names (a family's member too) and other prefixes do not warn
    r = run_python("import torch", env={"NEURON_RT_INSPECT_CPU_UTIL": "1", "TORCH_NEURONX_DEBUG_DIR": "/tmp/x",
                                        "MY_NEURON_THING": "1"})
    assert r.returncode == 0 and "is not a variable" not in r.stderr, r.stderr


@pytest.mark.parametrize("name, text, expected", [
    ("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", "maybe", "expected 1, true or yes (on), 0, false or no (off)"),
    ("TORCH_NEURONX_LOG_LEVEL", "7", "expected 0 (errors), 1 (warnings), 2 (info), 3 (debug)"),
    ("NEURON_RT_INSPECT_DEVICE_PROFILE", "all", "expected one of 0, 1, model, session"),
    ("COLLECTIVE_MIN_BUCKETS", "many", "expected a whole number from 0"),
])
def test_a_malformed_value_fails_the_start_up_naming_it(name, text, expected):
    r = run_python("import torch", env={name: text})
    assert r.returncode != 0
    assert f"ConfigError: {name}={text!r} is invalid: {expected}" in r.stderr, r.stderr


def test_log_level_sets_the_torchneuron_logger(tmp_path):
    code = "import torch, logging; print(logging.getLogger('torchneuron').getEffectiveLevel())"
    env = {"TORCH_NEURONX_ENABLE_ASYNC_NRT": "1"}
    notice = "TORCH_NEURONX_ENABLE_ASYNC_NRT='1' has no effect on this device"
    quiet = run_python(code, env=env, unset=("TORCH_NEURONX_LOG_LEVEL", "TORCH_NEURONX_LOG_FILE"))
    assert notice not in quiet.stderr, quiet.stderr
    for text, level in (("2", 20), ("INFO", 20), ("3", 10), ("0", 40)):
        r = run_python(code, env=env | {"TORCH_NEURONX_LOG_LEVEL": text}, unset=("TORCH_NEURONX_LOG_FILE",))
        assert r.stdout.strip() == str(level), r.stderr
        assert (f"[torchneuron] INFO {notice}" in r.stderr) == (level <= 20), r.stderr
    log = tmp_path / "neuron.log"
    r = run_python(code, env=env | {"TORCH_NEURONX_LOG_LEVEL": "3", "TORCH_NEURONX_LOG_FILE": str(log)})
    assert r.returncode == 0 and notice not in r.stderr
    assert notice in log.read_text() and "DEBUG TORCH_NEURONX_LOG_LEVEL='3'" in log.read_text()


def test_docs_list_every_registered_variable():
    with open(os.path.join(ROOT, "docs", "environment.md"), encoding="utf-8") as f:
        documented = set(re.findall(r"^\| `([A-Z][A-Z0-9_]*\*?)`", f.read(), re.MULTILINE))
    assert documented == {v.name for v in REGISTRY}
