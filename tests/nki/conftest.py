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


