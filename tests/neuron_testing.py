"""Helpers shared by the tests."""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Seed of the small models and inputs that tests run on `neuron` and on the CPU.
SEED = 7


def run_python(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (for environment variables read at start-up, fork, autoload)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=ROOT)


class DeviceTanhOnCpu:
    """Within this context, float32 `tanh` on CPU tensors is the device's own
    function (docs/numerics.md), everything else stays the CPU's. A CPU run of
    a program under it is the reference a `neuron` run must equal bit for bit:
    one ulp of tanh, magnified by later operators, would otherwise hide every
    other difference behind a tolerance. Autograd's backward of tanh uses the
    result, so gradients follow."""

    def __enter__(self):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        aten = torch.ops.aten

        def device_tanh(x):
            return torch.tanh(x.to("neuron")).cpu()

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                x = args[0] if args else None
                if (func in (aten.tanh.default, aten.tanh_.default) and isinstance(x, torch.Tensor)
                        and x.device.type == "cpu" and x.dtype == torch.float32):
                    y = device_tanh(x)
                    return x.copy_(y) if func is aten.tanh_.default else y
                # Composites reach a mode whole when autograd is off (inference
                # mode): decompose them here, so the mode sees their tanh.
                with self:
                    out = func.decompose(*args, **kwargs)
                return func(*args, **kwargs) if out is NotImplemented else out

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self._mode.__exit__(*exc)


def line_of(path, marker):
    """1-based line number of the line containing ``marker`` in ``path``."""
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if marker in line and "line_of(" not in line:
                return i
    raise AssertionError(f"marker {marker!r} not found")
