import pytest
import torch

import torchneuron  # noqa: F401  (explicit, so tests also run with autoload off)


@pytest.fixture(autouse=True)
def _device_is_quiet():
    """After each test: its device work has finished, and it left no device
    error behind. Errors are sticky (torch.neuron.reset_errors): a test that
    saw its errors raised gets them cleared; one that never synchronised after
    a failure fails here."""
    yield
    unreported = []
    for i in range(torch.neuron.device_count()):
        torchneuron._C._wait_idle(i, float("inf"))
        unreported += torch.neuron.device_errors(i)["unreported_errors"]
        torch.neuron.reset_errors(i)
    assert not unreported, f"the test left device errors no synchronising call raised: {unreported}"
