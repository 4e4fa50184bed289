"""The instruction-set levels of the device's own loops (csrc/bridge/kernels/isa.h):
with ATEN_CPU_CAPABILITY forcing ATen's AVX2 or DEFAULT kernels, the device
runs its AVX2 or portable loops, fused results still equal unfused ones bit
for bit (a subset of the fusion tests, the fusion fuzzer and the fuzzer's
fused path, each smaller than in CI's own run), and the device's tanh gives
the same bits as on this process's level."""
import hashlib
import os
import subprocess
import sys

import pytest
import torch

import torchneuron

HERE = os.path.dirname(os.path.abspath(__file__))
LEVELS = {"AVX512": 2, "AVX2": 1, "DEFAULT": 0}
# A sweep of bit patterns (every exponent, sign and NaN class) through the
# device's tanh: its hash, printed by a child.
def tanh_sweep():
    x = torch.arange(-2**31, 2**31, 4099, dtype=torch.int64).to(torch.int32).view(torch.float32)
    return hashlib.sha256(torch.tanh(x.to("neuron")).cpu().numpy().tobytes()).hexdigest()


TANH_SWEEP = f"""
import hashlib, torch, torchneuron
{__import__("inspect").getsource(tanh_sweep)}
print(torchneuron._C._isa()["path"], tanh_sweep())
"""


def _forced(capability):
    """Skips a level above ATen's on this host (ATen would run kernels the CPU lacks)."""
    if LEVELS[capability.upper()] > LEVELS.get(torch.backends.cpu.get_cpu_capability(), 0):
        pytest.skip(f"this host runs below {capability}")
    return {**os.environ, "ATEN_CPU_CAPABILITY": capability}


def _tanh_hash(env):
    r = subprocess.run([sys.executable, "-c", TANH_SWEEP], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.split()


def test_the_path_is_named_and_follows_atens_capability():
    isa = torchneuron._C._isa()
    expected = {"AVX512": "avx512", "AVX2": "avx2"}.get(torch.backends.cpu.get_cpu_capability(), "portable")
    assert isa["path"] == expected and isa["host"] in ("avx512", "avx2", "portable")


@pytest.mark.parametrize("capability, path", [("avx2", "avx2"), ("default", "portable")])
def test_forced_level_computes_fused_as_unfused_and_the_same_tanh(capability, path):
    env = _forced(capability)
    forced_path, forced = _tanh_hash(env)
    assert forced_path == path
    assert forced == tanh_sweep(), f"the device's tanh differs between {torchneuron._C._isa()['path']} and {path}"
    env.update(TORCHNEURON_FUSION_PROGRAMS="100", TORCHNEURON_FUZZ_PROGRAMS="40")
    fusion = "fuzz or two_nan or library or casts or single_element or typical_chains"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        os.path.join(HERE, "test_fusion.py"), "-k", fusion,
                        os.path.join(HERE, "test_device_tanh.py") + "::test_special_values",
                        os.path.join(HERE, "test_device_tanh.py") + "::test_same_bits_every_way_it_runs",
                        os.path.join(HERE, "fuzz", "test_fuzz.py") + "::test_fuzz[fused]"],
                       cwd=os.path.dirname(HERE), env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:]
    assert " passed" in r.stdout and " failed" not in r.stdout
