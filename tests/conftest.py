import pytest
import torch

import torchneuron  # noqa: F401  (explicit, so tests also run with autoload off)


@pytest.fixture(autouse=True)
def _device_is_quiet():
    yield
    torch.neuron.synchronize()
