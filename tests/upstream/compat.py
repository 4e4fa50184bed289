"""Compatibility shims between the fetched test files (an older PyTorch's, see
fetch.py) and this PyTorch's torch.testing._internal.

The test files are never edited. Names they import that this PyTorch moved or
removed are provided here, on the module they are imported from, before a test
file is imported; each shim says why it is faithful. A shim is only installed
when the name is missing, so it disappears by itself when the name comes back.
Tests whose subject this PyTorch changed are not shimmed: they fail on the CPU
too and do not count against `neuron` (runner.py compares the two devices).
"""
import contextlib
import functools
import importlib

PROVIDED = []  # (module, name, why), listed in REPORT.md


def _provide(module_name, name, value, why):
    mod = importlib.import_module(module_name)
    if not hasattr(mod, name):
        setattr(mod, name, value)
        PROVIDED.append((module_name, name, why))


def _decorator_factory_noop(*args, **kwargs):
    # Used both bare (@deco) and called (@deco(...)).
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda fn: fn


def _old_skipOps(test_case_name, base_test_name, to_skip):
    import unittest

    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.opinfo.core import DecorateInfo
    for spec in to_skip:
        if hasattr(spec, "op_name"):
            spec = (spec.op_name, spec.variant_name, spec.device_type, spec.dtypes, spec.expected_failure)
        op_name, variant_name, device_type, dtypes, expected_failure = spec
        # An OpInfo the older list names but this PyTorch dropped has nothing to decorate.
        for op in [o for o in op_db if o.name == op_name and o.variant_test_name == variant_name]:
            deco = unittest.expectedFailure if expected_failure else unittest.skip("Skipped!")
            op.decorators = tuple(op.decorators) + (
                DecorateInfo(deco, test_case_name, base_test_name, device_type=device_type, dtypes=dtypes),)
    return lambda fn: fn


def install():
    cdt = "torch.testing._internal.common_device_type"
    cmi = "torch.testing._internal.common_methods_invocations"
    dev = importlib.import_module(cdt)
    for name in ("skip", "xfail"):
        _provide(cmi, name, getattr(dev, name), "moved to common_device_type (same function)")
    _provide(cmi, "skipOps", _old_skipOps,
             "moved to common_device_type with another signature; the old one (test class, test, list) "
             "re-implemented: it adds skip/expectedFailure DecorateInfos to the named OpInfos")

    def binary_ufuncs_and_refs():
        m = importlib.import_module(cmi)
        return tuple(op for op in m.op_db + m.python_ref_db if isinstance(op, m.BinaryUfuncInfo))
    _provide(cmi, "binary_ufuncs_and_refs", binary_ufuncs_and_refs(),
             "removed; rebuilt as its old definition: the BinaryUfuncInfo entries of op_db + python_ref_db")

    # TF32/BF32 are CUDA and oneDNN reduced-precision modes; neither applies to
    # cpu-vs-neuron float32, so "not different from fp32" and a plain run are exact.
    _provide("torch.testing._internal.common_cuda", "tf32_is_not_fp32", lambda: False,
             "removed; False: no TF32 device here")
    mk = importlib.import_module("torch.testing._internal.common_mkldnn")
    _provide("torch.testing._internal.common_mkldnn", "bf32_on_and_off",
             getattr(mk, "reduced_f32_on_and_off", _decorator_factory_noop),
             "renamed reduced_f32_on_and_off")

    # Only the non-device-generic TestNN class generates tests from this list;
    # the harness runs device-generic classes only.
    _provide("torch.testing._internal.common_nn", "new_module_tests", [],
             "removed (tests moved to ModuleInfo); empty: feeds only TestNN, which is not device-generic")


def after_import(module):
    """Fixes to a test module once imported, for what 2.13's instantiation changed."""
    if module.__name__ == "test_linalg":
        # TestLinalg.setUp/tearDown call super(self.__class__, self): right when the device
        # classes were copies of the generic one, endless recursion now that the generic
        # class is in their MRO. The same bodies with the class named.
        import torch
        bases = {k for c in vars(module).values() if isinstance(c, type)
                 for k in c.__mro__ if k.__name__ == "TestLinalg" and k.__module__ == module.__name__}
        for base in bases:
            def setUp(self, base=base):
                super(base, self).setUp()
                torch.backends.cuda.matmul.allow_tf32 = False

            def tearDown(self, base=base):
                torch.backends.cuda.matmul.allow_tf32 = True
                super(base, self).tearDown()
            base.setUp, base.tearDown = setUp, tearDown
        PROVIDED.append(("test_linalg", "TestLinalg.setUp/tearDown",
                         "super(self.__class__, self) recursed in 2.13's device subclasses; same bodies, class named"))
