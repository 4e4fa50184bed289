import pytest
import torch

import torchneuron  # noqa: F401  (explicit, so tests also run with autoload off)
import torchneuron.memcheck
import torchneuron.sanitizer


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


# Under a whole-program checker (TORCHNEURON_MEMCHECK, TORCHNEURON_STREAM_SANITIZER: docs/sanitizers.md) the
# suite runs as it is; a test whose subject the checker changes says so, and is skipped there with its reason:
#     @pytest.mark.differs_under("memcheck", "blocks are padded, so byte counts differ")
CHECKERS = {"memcheck": lambda: torchneuron.memcheck.enabled(),
            "stream_sanitizer": lambda: torchneuron.sanitizer.active() is not None}


def pytest_configure(config):
    config.addinivalue_line("markers", "differs_under(checker, reason): what the test checks changes under that "
                                       f"whole-program checker ({', '.join(CHECKERS)}); skipped there")


def pytest_collection_modifyitems(config, items):
    on = {name for name, active in CHECKERS.items() if active()}
    for item in items:
        for mark in item.iter_markers("differs_under"):
            checker, reason = mark.args
            assert checker in CHECKERS, f"{item.nodeid}: unknown checker {checker!r}"
            if checker in on:
                item.add_marker(pytest.mark.skip(reason=f"under the {checker.replace('_', ' ')}: {reason}"))
