"""Stand-ins for the NKI Library harness's dependencies that its simulation mode never calls.

The library's test harness (its ``test/utils``) imports, at module level,
packages for running on remote Trainium hosts and for reporting: SSH
(``fabric2``, ``paramiko``), S3 and SQS (``boto3``, ``botocore``), CloudWatch
metrics (``aws_embedded_metrics``), HTML reports (``pytest_html``), terminal
histograms (``plotext``) and AWS's compiler front end
(``nki.compiler.frontend``).  A simulation run imports these modules but calls
none of them (metrics are off unless ``--metric-output`` is given).  When one
of them is not installed, ``install()`` enters a stand-in module whose every
attribute is a placeholder class: it can be named in annotations, ``except``
clauses and default arguments, and using an instance's attributes raises an
error saying the package is not installed.  Installed packages are used as
they are.

The published checkout also lacks modules of its own harness (locking cores
on remote hosts, analysing device profiles); ``install_missing()`` enters
stand-ins for them the same way.

``attr`` is the exception: the harness uses ``attr.dataclass`` to define a
class, so its stand-in gives the standard library's ``dataclass``.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
import types

# module names the harness imports -> the package a user would install for the real thing
STAND_INS = {
    "fabric2": "fabric2",
    "paramiko": "paramiko",
    "boto3": "boto3",
    "botocore": "botocore",
    "botocore.exceptions": "botocore",
    "botocore.credentials": "botocore",
    "aws_embedded_metrics": "aws-embedded-metrics",
    "aws_embedded_metrics.logger": "aws-embedded-metrics",
    "aws_embedded_metrics.logger.metrics_context": "aws-embedded-metrics",
    "aws_embedded_metrics.serializers": "aws-embedded-metrics",
    "aws_embedded_metrics.serializers.log_serializer": "aws-embedded-metrics",
    "pytest_html": "pytest-html",
    "pytest_html.extras": "pytest-html",
    "plotext": "plotext",
    "attr": "attrs",
    "debugpy": "debugpy",
}


class _StandInModule(types.ModuleType):
    """A module whose attributes are placeholder classes (made once per name)."""

    def __init__(self, name, package):
        super().__init__(name, f"Stand-in for {name} (package {package!r} is not installed); "
                               f"see torchneuron/nki/library_stand_ins.py.")
        self.__path__ = []
        self._package = package

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        placeholder = _placeholder(f"{self.__name__}.{attr}", self._package)
        setattr(self, attr, placeholder)
        return placeholder


def _placeholder(qualname, package):
    def unavailable(self, attr):
        raise RuntimeError(f"{qualname}.{attr}: package {package!r} is not installed; the NKI Library's "
                           f"simulation mode does not need it (torchneuron.nki.library_stand_ins)")
    # an exception class, so that the harness can name it in except clauses too
    return type(qualname.rsplit(".", 1)[-1], (Exception,), {"__getattr__": unavailable, "__module__": "stand_in"})


def _installed(name) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def _enter(name, package):
    module = _StandInModule(name, package)
    parent, _, child = name.rpartition(".")
    sys.modules[name] = module
    if parent in sys.modules:
        setattr(sys.modules[parent], child, module)
    return module


def install_missing(names, what) -> None:
    """Enter stand-ins for modules of the checkout itself that it does not ship (``what`` names them)."""
    for name in names:
        _enter(name, what)


def install() -> list[str]:
    """Enter a stand-in for every listed module that is not installed; returns their names."""
    entered = []
    for name, package in STAND_INS.items():
        if _installed(name):
            continue
        module = _enter(name, package)
        if name == "attr":
            module.dataclass = dataclasses.dataclass
        entered.append(name)
    return entered
