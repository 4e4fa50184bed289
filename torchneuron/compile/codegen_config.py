"""Inductor's code-generation settings for the ``neuron`` device: its
``device_custom_config`` (``register_backend_for_device``, inductor_device.py),
which Inductor's compile caches (FX graph, AOTAutograd) hash into every
graph's key.

``vec_isa`` is the vector instruction set the C++ kernels are generated and
compiled for: ``str(torch._inductor.cpu_vec_isa.pick_vec_isa())``, which
follows ATen's CPU capability (``ATEN_CPU_CAPABILITY`` lowers it). Inductor's
own key leaves it out. A cached graph whose kernels were generated for
AVX-512 (16 floats a vector), loaded by a process at AVX2, has them compiled
with 8-float vectors: every vector store writes half its elements, silently
(a zero fill leaves stale memory, and gradients accumulate across steps); the
other way round, stores run past their buffers. Keyed on the ISA, each level
generates its own graphs. Since the caches hash every registered device's
config, CPU graphs compiled in a process that registered ``neuron`` are keyed
on it too (tests/test_compile.py checks both, and that stock Inductor's own
key still lacks it).

``source_key`` hashes torchneuron's sources that shape what Inductor
generates (its patches of Inductor, the wrapper and the launcher), as
Inductor's key hashes PyTorch's own: a graph cached before a change to them
is not served after it.
"""
import sys

from torch.utils._config_module import install_config_module

vec_isa: str = ""
source_key: str = ""

install_config_module(sys.modules[__name__])
