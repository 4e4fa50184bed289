"""How the harness has PyTorch instantiate the test files' `neuron` classes:
as an accelerator, with what a test gives CUDA where it gives PrivateUse1
nothing of its own.

``instantiate_device_type_tests`` makes a file's ``...NEURON`` classes from
``common_device_type.PrivateUse1TestBase`` when the file is imported. Two
things there would treat `neuron` as less than the accelerator it is:

* The base's ``device_type`` is ``"privateuse1"`` until its ``setUpClass``
  first runs, which PyTorch does while instantiating the first test that takes
  a device. Until then the dtypes a test gives the backend by name
  (``@dtypesIfPRIVATEUSE1``, stored under ``"neuron"``) are not found, and the
  first class is named ``...PRIVATEUSE1``, the others ``...NEURON``. Run once
  before any file is imported, as any earlier test run in the process would.
* A test's dtypes come from its ``@dtypesIf<DEVICE>`` list for its device,
  else from its generic ``@dtypes``. Files often keep the generic list short
  for one backend's gaps (``# RngUniform not implemented for Integral type in
  XLA``) and give the CPU and CUDA the full one; PrivateUse1 then gets the
  short list, and the CPU variants of the other dtypes have no `neuron`
  partner to be compared with. A test with a CUDA list and no PrivateUse1 list
  gets, as its PrivateUse1 list, its generic dtypes followed by the CUDA
  list's others: what ``@dtypesIfPRIVATEUSE1`` would say for a device that runs
  ATen's kernels, with no generic variant lost.

Nothing else of a test changes; the test files are not edited. ADJUSTED lists
what this did, for REPORT.md.
"""
import functools

ADJUSTED = []  # (what, why), listed in REPORT.md
WIDENED = []  # "Class.test" given the CUDA list's dtypes, counted in REPORT.md
_installed = []


def _with_accelerator_dtypes(generic_test_class):
    """Adds the PrivateUse1 dtype list (see the module docstring) to each test of
    the class that has a CUDA list and none of its own."""
    import torch
    name = torch._C._get_privateuse1_backend_name()
    for attr, fn in vars(generic_test_class).items():
        lists = getattr(fn, "dtypes", None) if attr.startswith("test") else None
        if not isinstance(lists, dict) or "cuda" not in lists or name in lists or "all" not in lists:
            continue
        merged = list(lists["all"])
        merged += [d for d in lists["cuda"] if d not in merged]
        if len(merged) > len(lists["all"]):
            lists[name] = tuple(merged)
            WIDENED.append(f"{generic_test_class.__name__}.{attr}")


def install():
    """Before the first test file is imported."""
    if _installed:
        return
    _installed.append(True)
    from torch.testing._internal import common_device_type as cdt

    cdt.PrivateUse1TestBase.setUpClass()
    ADJUSTED.append(("PrivateUse1TestBase.device_type",
                     "set to the backend's name before any class is instantiated (PrivateUse1TestBase.setUpClass), "
                     "as after any earlier test of the process: every class is ...NEURON and @dtypesIfPRIVATEUSE1 "
                     "is found"))
    original = cdt.instantiate_device_type_tests

    @functools.wraps(original)
    def instantiate_device_type_tests(generic_test_class, scope, *args, **kwargs):
        _with_accelerator_dtypes(generic_test_class)
        return original(generic_test_class, scope, *args, **kwargs)

    # The test files import the function by name: they take this one.
    cdt.instantiate_device_type_tests = instantiate_device_type_tests
    ADJUSTED.append(("instantiate_device_type_tests",
                     "a test with a @dtypesIfCUDA list and no PrivateUse1 list runs on neuron with its generic "
                     "dtypes plus the CUDA list's others (generic lists often leave out what one backend lacks)"))
