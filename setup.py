# Builds torchneuron._C: the torch-free runtime (csrc/runtime) and the PyTorch
# bridge (csrc/bridge) in one extension, with ninja. Install with
#   pip install --no-build-isolation -e .
# (no build isolation: the extension compiles against the installed torch).
import glob
import os

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths

ROOT = os.path.dirname(os.path.abspath(__file__))
sources = sorted(glob.glob("csrc/runtime/*.cpp") + glob.glob("csrc/bridge/**/*.cpp", recursive=True))

setup(
    name="torchneuron",
    version="0.1.0",
    description="An emulated AWS NeuronCore as a native PyTorch device: neuron",
    license="Apache-2.0",
    license_files=["LICENSE"],
    # torch_neuronx: AWS's import name for TorchNeuron, which Hugging Face
    # libraries look for (torch_neuronx/__init__.py); it imports torchneuron.
    # nki: the import name of the NKI language in TorchNeuron programs (nki/__init__.py).
    packages=find_packages(include=["torchneuron", "torchneuron.*", "torch_neuronx", "torch_neuronx.*", "nki"]),
    # The explorer's report template, stylesheet and script (torchneuron/explorer/render.py).
    package_data={"torchneuron": ["py.typed", "explorer/assets/*"]},
    # scripts/setup_env.sh builds the extension in place (incremental ninja
    # build) and then registers the package with TORCHNEURON_METADATA_ONLY=1,
    # so pip does not compile it a second time.
    ext_modules=[] if os.environ.get("TORCHNEURON_METADATA_ONLY") else [
        CppExtension(
            "torchneuron._C",
            sources,
            # Kineto's headers ship in the wheel (the profiler's PrivateUse1
            # interface includes them by bare name).
            include_dirs=[os.path.join(ROOT, "csrc"), os.path.join(include_paths()[0], "kineto")],
            # -fopenmp: ATen's at::parallel_for is a header template that runs
            # serially unless the including code is built with OpenMP. At run
            # time this resolves to the libgomp.so.1 torch has already loaded.
            extra_compile_args={"cxx": ["-O2", "-Wno-unused-parameter", "-fopenmp"]},
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    entry_points={"torch.backends": ["torchneuron = torchneuron:_autoload"],
                  # the lock-in report (torchneuron/lockin/, docs/lockin.md)
                  "console_scripts": ["torchneuron-lockin = torchneuron.lockin.__main__:main"]},
    python_requires=">=3.10",
)
