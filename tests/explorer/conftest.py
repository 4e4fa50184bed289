"""The explorer's tests: one known program profiled on `neuron` per session, and
where screenshots go."""
import os

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

HERE = os.path.dirname(os.path.abspath(__file__))
# Screenshots of each view (git-ignored); EXPLORER_ARTIFACTS writes them elsewhere.
ARTIFACTS = os.environ.get("EXPLORER_ARTIFACTS", os.path.join(HERE, "artifacts"))
KNOWN_STEPS = 2


def known_program(steps=KNOWN_STEPS):
    """Training steps of a small MLP on `neuron`, reading the loss back every step
    (a synchronising call). Returns the losses."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).to("neuron")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 64).to("neuron"), torch.randn(32, 8).to("neuron")
    losses = []
    for step in range(steps):
        with record_function(f"step {step}"):
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


@pytest.fixture(scope="session")
def known_trace(tmp_path_factory):
    """The chrome trace of known_program under torch.profiler, host and device activities."""
    path = tmp_path_factory.mktemp("explorer") / "known_program.json"
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], record_shapes=True,
                 profile_memory=True, with_stack=True) as prof:
        known_program()
    prof.export_chrome_trace(str(path))
    return str(path)
