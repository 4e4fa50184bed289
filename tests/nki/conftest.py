import os
import sys

import numpy as np
import pytest

# The tests import the package from the repository checkout.
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def line_of(path, marker):
    """1-based line number of the line containing ``marker`` in ``path``."""
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if marker in line and "line_of(" not in line:
                return i
    raise AssertionError(f"marker {marker!r} not found")
