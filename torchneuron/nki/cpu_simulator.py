"""The ``nki_cpu_simulator`` interface, answered by this emulator.

AWS's NKI Library (aws-neuron/nki-library) tests its kernels on the CPU with
``--test-mode simulation``: its harness imports a package named
``nki_cpu_simulator`` (AWS's CPU simulator), puts its ``nki`` modules in
place of ``nki`` (``nki``, ``nki.language``, ``nki.language.dtypes``,
``nki.isa``, ``nki.isa.constants``, ``nki.typing``, ``nki.compiler``,
``nki.tensor`` and ``nki.builtin``) and runs each kernel with
``nki.cpu_simulate(kernel)[lnc](**inputs)``, reading the target NeuronCore
generation from ``NKI_NC_VERSION`` (``gen3``, ``gen4``).

``install()`` enters that package in ``sys.modules`` with every module being
this emulator's own, so the library's suite runs against torchneuron.nki
unchanged (``python -m torchneuron.nki.library``).
"""
from __future__ import annotations

import os
import sys
import types

import torchneuron.nki as pkg

from . import collectives, compiler, dtypes, frontend, isa, isa_constants, language, typing
from .jit import Kernel, run_on_host_buffers
from .machine import resolve_machine

# the environment variable the library's harness sets to the target's generation
NC_VERSION_ENV = "NKI_NC_VERSION"


class _Simulated:
    """``cpu_simulate(kernel)``: index with the logical-NeuronCore count, then call with the inputs."""

    def __init__(self, kernel, grid=()):
        self.kernel = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
        self.grid = grid

    def __getitem__(self, grid):
        return _Simulated(self.kernel, grid if isinstance(grid, tuple) else (grid,))

    def __call__(self, *args, **kwargs):
        k = self.kernel
        target = k.target
        generation = os.environ.get(NC_VERSION_ENV)
        if target is None and generation:
            target = resolve_machine(generation)
        # a logical NeuronCore of one physical core is a launch without a grid
        grid = () if self.grid in ((), (1,)) else self.grid
        return run_on_host_buffers(k.fn, grid, args, kwargs, target=target, debug=k.debug,
                                   kernel_name=k.fn.__name__, cache=k._traces)


def cpu_simulate(kernel):
    """Run ``kernel`` on the emulator: ``cpu_simulate(kernel)[lnc](**numpy_inputs)`` returns NumPy outputs."""
    return _Simulated(kernel)


def _module(name, doc, **attrs):
    m = types.ModuleType(name, doc)
    m.__dict__.update(attrs)
    return m


class _SimulatorNki(types.ModuleType):
    """The simulator's ``nki`` package: torchneuron.nki's names, plus ``cpu_simulate`` and the
    submodule attributes the harness imports (``builtin``; ``isa.constants``, ``language.dtypes``)."""

    def __getattr__(self, name):
        return getattr(pkg, name)


def modules() -> dict:
    """The ``nki_cpu_simulator`` module tree, by its ``sys.modules`` names."""
    builtin = _module("nki_cpu_simulator.nki.builtin",
                      "The simulator's builtins (the harness makes them ``builtins.builtin``): the language's "
                      "functions.", **{k: v for k, v in vars(language).items() if not k.startswith("_")})
    isa.constants = isa_constants
    language.dtypes = dtypes
    compiler.frontend = frontend
    nki = _SimulatorNki("nki_cpu_simulator.nki", pkg.__doc__)
    nki.__path__ = []
    nki.__dict__.update(builtin=builtin, cpu_simulate=cpu_simulate, language=language, isa=isa, typing=typing,
                        compiler=compiler, collectives=collectives, dtype=dtypes)
    root = _module("nki_cpu_simulator", __doc__, nki=nki)
    root.__path__ = []
    return {
        "nki_cpu_simulator": root,
        "nki_cpu_simulator.nki": nki,
        "nki_cpu_simulator.nki.builtin": builtin,
        "nki_cpu_simulator.nki.collectives": collectives,
        "nki_cpu_simulator.nki.compiler": compiler,
        "nki_cpu_simulator.nki.compiler.frontend": frontend,
        "nki_cpu_simulator.nki.isa": isa,
        "nki_cpu_simulator.nki.isa.constants": isa_constants,
        "nki_cpu_simulator.nki.language": language,
        "nki_cpu_simulator.nki.language.dtypes": dtypes,
        "nki_cpu_simulator.nki.tensor": pkg.tensor,
        "nki_cpu_simulator.nki.typing": typing,
    }


def install():
    """Enter ``nki_cpu_simulator`` (this emulator) in ``sys.modules``; returns its ``nki`` package."""
    tree = modules()
    sys.modules.update(tree)
    return tree["nki_cpu_simulator.nki"]
