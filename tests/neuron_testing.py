"""Helpers shared by the tests."""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Seed of the small models and inputs that tests run on `neuron` and on the CPU.
SEED = 7


def run_python(code: str, env: dict | None = None, timeout: float = 120,
               unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (for environment variables read at start-up, fork, autoload),
    with this process's environment less `unset`, plus `env`."""
    full_env = {k: v for k, v in os.environ.items() if k not in unset} | (env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=ROOT)


#: ATen's CPU capabilities, by level
CPU_LEVELS = {"DEFAULT": 0, "AVX2": 1, "AVX512": 2}


def skip_above_host(capability: str) -> None:
    """Skips a test that forces ATen's CPU capability above this host's (ATen would run kernels the CPU lacks)."""
    import pytest
    import torch

    host = torch.backends.cpu.get_cpu_capability()
    if CPU_LEVELS[capability.upper()] > CPU_LEVELS.get(host, 0):
        pytest.skip(f"this host runs ATen at {host}, below {capability}")


def line_of(path, marker):
    """1-based line number of the line containing ``marker`` in ``path``."""
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if marker in line and "line_of(" not in line:
                return i
    raise AssertionError(f"marker {marker!r} not found")


def queue_busy_work(device: str = "neuron", repeats: int = 2) -> None:
    """Queues slow work (matrix products), so that what follows waits in the
    queue and can fuse (docs/adaptive_eager.md)."""
    import torch

    a = torch.ones(384, 384, device=device)
    for _ in range(repeats):
        a = a @ a / 384


class FusableFrom:
    """Within this context, element-wise work of `numel` elements and more
    is offered to the fuser (by default from 32K elements, ATen's grain size;
    the fuser's cost model then decides), whatever a test before it set."""

    def __init__(self, numel: int = 1 << 15):
        self.numel = numel

    def __enter__(self):
        import torchneuron

        self._default = torchneuron._C._min_fusable_numel()
        torchneuron._C._set_min_fusable_numel(self.numel)
        return self

    def __exit__(self, *exc):
        import torchneuron

        torchneuron._C._set_min_fusable_numel(self._default)


def raw_bits(t):
    """`t` on the host as integers of its elements' bits (NaN payloads and
    signed zeros count; conjugate and negative views resolved), for equality
    bit for bit."""
    import torch

    t = t.detach().cpu().resolve_conj().resolve_neg()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.is_floating_point():
        t = t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t
