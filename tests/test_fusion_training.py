"""Adaptive eager fuses in real training, at the demo's sizes, where its cost
model (csrc/bridge/fusion/cost_model.h) says it pays: the demo GPT's step,
its transformer block and an LSTM cell fuse (the fuser's own counters), and
their results equal the CPU's bit for bit."""
import os
import sys

import pytest
import torch

import torchneuron

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import gpt_model as gm  # noqa: E402

from benchmarks.common import Config, fused_in_one_step  # noqa: E402
from benchmarks.fusion_workloads import block_train, lstm_cell_train  # noqa: E402


def test_the_demo_step_fuses():
    cfg, tc = gm.GPTConfig(), gm.TrainConfig()
    model = gm.GPT(cfg, generator=torch.Generator().manual_seed(0)).to("neuron")
    opt = gm.make_optimizer(model, tc)
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(cfg.vocab_size, (tc.batch_size, cfg.block_size), generator=g).to("neuron")
            for _ in range(2))

    def step():
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    fused = fused_in_one_step(step)
    assert fused["fused_tasks_per_step"] > 0 and fused["fused_ops_per_step"] > fused["fused_tasks_per_step"]


@pytest.mark.parametrize("workload", [block_train, lstm_cell_train], ids=["transformer_block", "lstm_cell"])
def test_fuses_and_equals_the_cpu_bitwise(workload):
    build = workload(Config())  # the demo's sizes: its activations fuse
    step = build(torch.device("neuron"))
    fused = fused_in_one_step(step)
    assert fused["fused_tasks_per_step"] > 0
    grad = step()  # the third step: gradients accumulate over the three
    expected = build(torch.device("cpu"))
    for _ in range(2):
        expected()
    expected = expected()
    assert torch.equal(grad.cpu(), expected), "fused training differs from the CPU"
