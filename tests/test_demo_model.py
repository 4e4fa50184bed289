"""Model parity for the demo (examples/train_gpt.py, model in examples/gpt_model.py).

* The demo's GPT trained 20 steps from the same seed on ``neuron`` and on the
  CPU gives the same losses (float32, relative difference < 1e-5).
* CPU runs are bit-for-bit reproducible, checkpoints round-trip across devices
  with ``map_location``, and resuming from a checkpoint reproduces an
  uninterrupted run.

The ``neuron`` device must be available: a missing device fails these tests
rather than skipping them.
"""

import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import gpt_model as gm  # noqa: E402

PARITY_STEPS = 20
SEED = 2024
REL_TOL = 1e-5


def _neuron_status() -> tuple[bool, str]:
    mod = getattr(torch, "neuron", None)
    if mod is None:
        try:  # autoload may be off (TORCH_DEVICE_BACKEND_AUTOLOAD=0)
            import torchneuron  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return False, f"the neuron device is unavailable: cannot import torchneuron ({type(e).__name__}: {e})"
        mod = getattr(torch, "neuron", None)
    if mod is None:
        return False, "the neuron device is unavailable: torch.neuron is not registered"
    try:
        if not mod.is_available():
            return False, "the neuron device is unavailable: torch.neuron.is_available() is False"
    except Exception as e:  # noqa: BLE001
        return False, f"the neuron device is unavailable: torch.neuron.is_available() raised {e!r}"
    return True, ""


NEURON_OK, NEURON_REASON = _neuron_status()
assert NEURON_OK, NEURON_REASON
DEVICES = ["cpu", "neuron"]


def _rel_diffs(a, b):
    return [abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)]


@pytest.fixture(scope="module")
def cpu_reference():
    return gm.train("cpu", PARITY_STEPS, SEED, keep_model=False).losses


def test_cpu_run_is_deterministic(cpu_reference):
    again = gm.train("cpu", PARITY_STEPS, SEED, keep_model=False).losses
    assert len(cpu_reference) == PARITY_STEPS
    assert all(math.isfinite(v) for v in cpu_reference)
    assert again == cpu_reference, f"max rel diff {max(_rel_diffs(again, cpu_reference)):.3e}"
    # it learns: the last loss is well below the initial ~ln(vocab)
    assert cpu_reference[-1] < cpu_reference[0] - 0.5


def test_different_seed_differs(cpu_reference):
    other = gm.train("cpu", 2, SEED + 1, keep_model=False).losses
    assert other[0] != cpu_reference[0]


def test_neuron_matches_cpu(cpu_reference):
    res = gm.train("neuron", PARITY_STEPS, SEED, keep_model=False)
    assert res.device.startswith("neuron")
    assert len(res.losses) == PARITY_STEPS
    rel = _rel_diffs(res.losses, cpu_reference)
    worst = max(range(len(rel)), key=rel.__getitem__)
    assert max(rel) < REL_TOL, (
        f"step {worst + 1}: neuron loss {res.losses[worst]!r} vs cpu {cpu_reference[worst]!r} "
        f"(relative difference {rel[worst]:.3e} >= {REL_TOL})")


@pytest.mark.parametrize("device", DEVICES)
def test_checkpoint_roundtrip_and_resume(device, tmp_path):
    """Save on `device`, reload on the CPU via map_location, and check that
    3 steps + resume 2 steps == 5 uninterrupted steps (all inside warm-up, so
    the learning-rate schedule is the same for both)."""
    tc = gm.TrainConfig(batch_size=8)
    straight = gm.train(device, 5, SEED, train_config=tc, keep_model=False).losses

    ckpt = str(tmp_path / "gpt.pt")
    first = gm.train(device, 3, SEED, train_config=tc, checkpoint_path=ckpt)
    cpu_model, cpu_opt, meta = gm.load_checkpoint(ckpt, "cpu")
    assert meta["step"] == 3
    assert all(p.device.type == "cpu" for p in cpu_model.parameters())
    assert all(t.device.type == "cpu" for s in cpu_opt.state.values() for t in s.values()
               if isinstance(t, torch.Tensor) and t.dim() > 0)
    tok, _, _ = gm.load_dataset()
    ids = torch.tensor([tok.encode(gm.make_corpus()[:64])])
    with torch.no_grad():
        first.model.eval()
        cpu_model.eval()
        ref = first.model(ids.to(device))[0].cpu()
        torch.testing.assert_close(cpu_model(ids)[0], ref, rtol=0, atol=0)

    resumed = gm.train(device, 2, SEED, train_config=tc, resume_from=ckpt, keep_model=False).losses
    assert resumed[:3] == first.losses
    assert len(resumed) == 5
    rel = _rel_diffs(resumed, straight)
    assert max(rel) < REL_TOL, f"resumed {resumed} vs straight {straight}"


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_reproducible_per_seed(device):
    """Dropout draws from the device generator: same seed => same losses."""
    mc = gm.GPTConfig(dropout=0.1)
    tc = gm.TrainConfig(batch_size=8)
    a = gm.train(device, 4, SEED, model_config=mc, train_config=tc, keep_model=False).losses
    b = gm.train(device, 4, SEED, model_config=mc, train_config=tc, keep_model=False).losses
    assert a == b
    no_drop = gm.train(device, 1, SEED, train_config=tc, keep_model=False).losses
    assert a[0] != no_drop[0]  # dropout is actually active


def test_lr_schedule():
    tc = gm.TrainConfig(steps=100, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    assert gm.lr_at(0, tc) == pytest.approx(1e-4)
    assert gm.lr_at(9, tc) == pytest.approx(1e-3)
    assert gm.lr_at(10, tc) == pytest.approx(1e-3)
    assert gm.lr_at(55, tc) == pytest.approx(0.55e-3)
    assert gm.lr_at(100, tc) == pytest.approx(1e-4)
    lrs = [gm.lr_at(s, tc) for s in range(10, 101)]
    assert all(x >= y for x, y in zip(lrs, lrs[1:]))


def test_generated_corpus_is_fixed():
    text = gm.make_corpus()
    assert len(text) >= 300_000
    assert text == gm.make_corpus.__wrapped__()  # not just the cache
    assert gm.make_corpus(1000, seed=1) != gm.make_corpus(1000, seed=2)
