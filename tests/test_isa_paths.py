"""The instruction-set levels of the device's own loops (csrc/bridge/kernels/isa.h):
with ATEN_CPU_CAPABILITY forcing ATen's AVX2 or DEFAULT kernels, the device
runs its AVX2 or portable loops, fused results still equal unfused ones bit
for bit (a subset of the fusion tests, the fused DAGs, the fusion fuzzer and
the fuzzer's fused path, each smaller than in CI's own run), float32 tanh, unfused and
fused, equals that level's CPU tanh on every 61st float, and the device's own
tanh (TORCHNEURON_DEVICE_TANH=1) gives the same bits as on the host's own
level."""
import hashlib
import os
import re
import subprocess
import sys

import pytest
import torch

import torchneuron
from neuron_testing import skip_above_host

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# A sweep of bit patterns (every exponent, sign and NaN class) through the
# device's own tanh: its hash, printed by a child (run with the option).
def tanh_sweep():
    x = torch.arange(-2**31, 2**31, 4099, dtype=torch.int64).to(torch.int32).view(torch.float32)
    return hashlib.sha256(torch.tanh(x.to("neuron")).cpu().numpy().tobytes()).hexdigest()


TANH_SWEEP = f"""
import hashlib, torch, torchneuron
{__import__("inspect").getsource(tanh_sweep)}
print(torchneuron._C._isa()["path"], tanh_sweep())
"""


def _forced(capability):
    skip_above_host(capability)
    return {**os.environ, "ATEN_CPU_CAPABILITY": capability}


def _own_tanh_hash(env):
    env = {**env, "TORCHNEURON_DEVICE_TANH": "1"}
    r = subprocess.run([sys.executable, "-c", TANH_SWEEP], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.split()


def test_the_path_is_named_and_follows_atens_capability():
    isa = torchneuron._C._isa()
    expected = {"AVX512": "avx512", "AVX2": "avx2"}.get(torch.backends.cpu.get_cpu_capability(), "portable")
    assert isa["path"] == expected and isa["host"] in ("avx512", "avx2", "portable")


def _pytest(env, *tests):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                       cwd=os.path.dirname(HERE), env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:]
    assert " passed" in r.stdout and " failed" not in r.stdout


@pytest.mark.parametrize("capability, path", [("avx2", "avx2"), ("default", "portable")])
def test_forced_level_computes_fused_as_unfused_and_the_cpus_tanh(capability, path):
    env = _forced(capability)
    forced_path, forced = _own_tanh_hash(env)
    assert forced_path == path
    host_path, host = _own_tanh_hash(dict(os.environ))
    assert forced == host, f"the device's own tanh differs between {host_path} and {path}"
    tanh = os.path.join(HERE, "test_device_tanh.py")
    _pytest({**env, "TORCHNEURON_DEVICE_TANH": "1"}, tanh + "::test_own_special_values",
            tanh + "::test_own_same_bits_every_way_it_runs")
    env.update(TORCHNEURON_FUSION_PROGRAMS="100", TORCHNEURON_FUZZ_PROGRAMS="40")
    fusion = "fuzz or two_nan or library or casts or single_element or typical_chains or dag"
    _pytest(env, os.path.join(HERE, "test_fusion.py"), os.path.join(HERE, "test_fusion_dag.py"),
            "-k", fusion)  # (-k filters every file named)
    _pytest(env, tanh + "::test_the_cpus_bits_over_every_61st_float_unfused_and_fused",
            tanh + "::test_the_cpus_bits_for_special_values_and_every_way_it_runs",
            os.path.join(HERE, "fuzz", "test_fuzz.py") + "::test_fuzz[fused]")


# What only compiles for x86: intrinsics and their headers and types, inline
# cpuid and rdtsc, and x86's signal-frame registers.
X86_ONLY = re.compile(r"[a-z]mmintrin\.h|\b_mm\d*_\w+|\b__m(128|256|512)|\b__builtin_ia32_|\"cpuid\"|\brdtsc|"
                      r"\bREG_(RIP|ERR)\b|\bgregs\b|\bfpregs\b")
X86_GUARD = re.compile(r"__x86_64__|__SSE\d?__|__AVX\w*__")


def x86_only_lines_outside_guards(path):
    """Lines of a C++ source that only compile for x86 and are not inside an
    #if on an x86 macro (in its branch that holds on x86)."""
    out, stack = [], []  # per open #if: whether its current branch is x86-only
    for number, line in enumerate(open(path), 1):
        directive = line.strip()
        if directive.startswith(("#if", "#ifdef", "#ifndef")):
            stack.append(bool(X86_GUARD.search(directive)) and not directive.startswith("#ifndef")
                         and "!" not in directive)
        elif directive.startswith("#elif"):
            stack[-1] = bool(X86_GUARD.search(directive))
        elif directive.startswith("#else"):
            stack[-1] = False
        elif directive.startswith("#endif"):
            stack.pop()
        elif X86_ONLY.search(line.split("//")[0]) and not any(stack):
            out.append(f"{os.path.relpath(path, REPO)}:{number}: {line.strip()}")
    return out


def test_x86_only_code_sits_inside_x86_guards():
    """So that the extension builds on aarch64 (scripts/cross_compile_aarch64.sh
    shows it; this catches the common slips without a cross toolchain)."""
    sources = [os.path.join(d, f) for d, _, files in os.walk(os.path.join(REPO, "csrc"))
               for f in files if f.endswith((".cpp", ".h"))]
    assert len(sources) > 50
    found = [line for path in sorted(sources) for line in x86_only_lines_outside_guards(path)]
    assert not found, "x86-only code outside an x86 guard:\n" + "\n".join(found)


def test_the_guard_check_finds_unguarded_x86_code(tmp_path):
    src = tmp_path / "a.cpp"
    src.write_text('#include <immintrin.h>\n#if defined(__x86_64__)\n__m256 f();\n#else\n__m256 g();\n#endif\n'
                   '#ifdef __AVX2__\nint x = _mm_popcnt_u32(3);\n#endif\n')
    assert [line.split(": ", 1)[1] for line in x86_only_lines_outside_guards(src)] == [
        "#include <immintrin.h>", "__m256 g();"]
