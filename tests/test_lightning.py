"""Lightning on ``neuron`` (torchneuron/lightning.py, docs/lightning.md):
training runs against the same runs on the CPU, the registries, bad input,
and for each gap of Lightning 2.6 a ``test_gap_*`` that fails, asking for
docs/lightning.md to be updated, when an upgrade closes it.

Small random-initialised model, synthetic data, offline.
"""
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import torchneuron.lightning as neuron_lightning
import lightning.pytorch as pl
from lightning.pytorch.accelerators import AcceleratorRegistry, CPUAccelerator
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, StrategyRegistry
from lightning.pytorch.utilities.exceptions import MisconfigurationException

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STEPS, BATCH = 6, 8
GAP_CLOSED = "Lightning no longer has this gap: update docs/lightning.md and this test"


def gap_still_there(condition: bool, gap: str) -> None:
    assert condition, f"{gap}: {GAP_CLOSED}"


def dataset():
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(64, 16, generator=generator)
    return inputs, inputs[:, :4].sum(1, keepdim=True).sin() + 0.1 * torch.randn(64, 1, generator=generator)


class Regressor(pl.LightningModule):
    """An MLP whose training step records its losses and the dtype and device of its first matmul."""

    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(16, 32)
        self.out = torch.nn.Linear(32, 1)
        self.losses, self.matmul_dtypes, self.matmul_devices = [], [], []

    def training_step(self, batch, index):
        inputs, targets = batch
        hidden = self.hidden(inputs)
        self.matmul_dtypes.append(hidden.dtype)
        self.matmul_devices.append(hidden.device)
        loss = torch.nn.functional.mse_loss(self.out(torch.relu(hidden)).float(), targets)
        self.losses.append(loss.detach().cpu())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def trainer(**kwargs):
    return pl.Trainer(max_steps=STEPS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, **kwargs)


def fit(**kwargs):
    torch.manual_seed(0)
    module = Regressor()
    run = trainer(**kwargs)
    run.fit(module, DataLoader(TensorDataset(*dataset()), batch_size=BATCH))
    return module, run


def parameters(module):
    return [p.detach().cpu() for p in module.parameters()]


def assert_bitwise(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and torch.equal(x, y), (x - y).abs().max()


# ---------------------------------------------------------------- registries
def test_registries_know_neuron():
    assert "neuron" in AcceleratorRegistry.available_accelerators()
    assert isinstance(AcceleratorRegistry.get("neuron"), neuron_lightning.NeuronAccelerator)
    assert {"single_neuron", "ddp_neuron"} <= set(StrategyRegistry.available_strategies())
    neuron_lightning.register()  # a second registration is a no-op, not Lightning's "already present" error
    run = trainer(accelerator="neuron", strategy="single_neuron")
    assert isinstance(run.accelerator, neuron_lightning.NeuronAccelerator)
    assert isinstance(run.strategy, neuron_lightning.SingleNeuronStrategy)
    assert run.strategy.root_device == torch.device("neuron", 0)
    assert trainer(accelerator="neuron", devices=[1], strategy="single_neuron").strategy.root_device == \
        torch.device("neuron", 1)
    assert trainer(accelerator="neuron", strategy=neuron_lightning.SingleNeuronStrategy("neuron:1")) \
        .strategy.root_device == torch.device("neuron", 1)
    ddp = trainer(accelerator="neuron", devices=2, strategy="ddp_neuron").strategy
    assert isinstance(ddp, neuron_lightning.NeuronDDPStrategy)
    assert ddp.parallel_devices == [torch.device("neuron", 0), torch.device("neuron", 1)]
    assert neuron_lightning.NeuronAccelerator.auto_device_count() == torch.neuron.device_count()


@pytest.mark.parametrize("devices,message", [
    ([5], r"names neuron:5, but there are 2 neuron devices"),
    (3, r"asks for 3 neuron devices, but there are 2"),
    ("0,7", r"names neuron:7"),
    ([0, 0], r"more than once"),
    (-2, r"at least one neuron device"),
    ("x", r"not a number"),
])
def test_bad_devices_raise_naming_the_problem(devices, message):
    assert torch.neuron.device_count() == 2
    with pytest.raises(MisconfigurationException, match=message):
        trainer(accelerator="neuron", devices=devices, strategy="single_neuron")


def test_single_neuron_strategy_refuses_another_device():
    with pytest.raises(MisconfigurationException, match="must be a neuron device"):
        neuron_lightning.SingleNeuronStrategy("cpu")


# ---------------------------------------------------------------- training
def test_float32_training_bitwise_as_on_the_cpu():
    neuron, run = fit(accelerator="neuron", strategy="single_neuron")
    cpu, _ = fit(accelerator="cpu")
    assert run.global_step == STEPS and len(neuron.losses) == STEPS
    assert set(neuron.matmul_devices) == {torch.device("neuron", 0)}  # (the Trainer moves it back at the end)
    assert set(neuron.matmul_dtypes) == {torch.float32}
    assert_bitwise(neuron.losses, cpu.losses)
    assert_bitwise(parameters(neuron), parameters(cpu))


def test_bf16_mixed_autocasts_on_neuron_as_on_the_cpu():
    """precision="bf16-mixed" autocasts on neuron: the first matmul's output is
    bfloat16. The device's casting lists are CUDA's, the CPU's differ, but for
    this model (linear layers, relu, mse_loss in float32) both run the same
    operators in the same dtypes, so losses and parameters are bit for bit."""
    neuron, run = fit(accelerator="neuron", strategy="single_neuron", precision="bf16-mixed")
    cpu, _ = fit(accelerator="cpu", precision="bf16-mixed")
    plugin = run.precision_plugin
    assert isinstance(plugin, MixedPrecision) and plugin.device == "neuron" and plugin.scaler is None
    assert set(neuron.matmul_dtypes) == {torch.bfloat16}
    assert_bitwise(neuron.losses, cpu.losses)
    assert_bitwise(parameters(neuron), parameters(cpu))
    full, _ = fit(accelerator="neuron", strategy="single_neuron")
    assert not torch.equal(torch.stack(neuron.losses), torch.stack(full.losses))  # it did not train in float32


def test_16_mixed_autocasts_in_float16_with_a_neuron_grad_scaler():
    neuron, run = fit(accelerator="neuron", strategy="single_neuron", precision="16-mixed")
    plugin = run.precision_plugin
    assert plugin.device == "neuron" and isinstance(plugin.scaler, torch.amp.GradScaler)
    assert plugin.scaler._device == "neuron" and plugin.scaler.is_enabled()
    assert set(neuron.matmul_dtypes) == {torch.float16}
    assert torch.stack(neuron.losses).isfinite().all()
    # the same float16 computation by hand: torch.autocast("neuron") and GradScaler("neuron"), Lightning's order
    torch.manual_seed(0)
    module = Regressor().to("neuron")
    optimizer = module.configure_optimizers()
    scaler = torch.amp.GradScaler("neuron")
    losses = []
    for index, batch in zip(range(STEPS), DataLoader(TensorDataset(*dataset()), batch_size=BATCH)):
        with torch.autocast("neuron", dtype=torch.float16, cache_enabled=False):
            loss = module.training_step([t.to("neuron") for t in batch], index)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    assert_bitwise(neuron.losses, module.losses)
    assert_bitwise(parameters(neuron), parameters(module))


@pytest.fixture(scope="module")
def ddp_ranks(tmp_path_factory):
    """What each rank of lightning_ddp_script.py saved (one run for the module)."""
    out = tmp_path_factory.mktemp("lightning_ddp")
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, os.path.join(HERE, "lightning_ddp_script.py"), str(out)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_ddp_on_two_devices_as_two_half_batches_by_hand(ddp_ranks):
    """Trainer(accelerator="neuron", devices=2, strategy="ddp_neuron") in two
    processes (Lightning's launcher starts the second), over the
    torch.distributed backend "neuron": each rank's losses, and both ranks'
    final parameters, bit for bit the same steps computed by hand on the CPU
    (each rank's samples as Lightning's DistributedSampler draws them; the
    gradient is g0/2 + g1/2, as DDP averages two ranks)."""
    ranks = ddp_ranks
    for rank, result in enumerate(ranks):
        assert result["strategy"] == "NeuronDDPStrategy" and result["backend"] == "neuron"
        assert result["world_size"] == 2
        assert result["root_device"] == f"neuron:{rank}" and result["step_devices"] == [f"neuron:{rank}"]

    torch.manual_seed(0)
    module = Regressor()
    optimizer = module.configure_optimizers()
    inputs, targets = dataset()
    order = [[], []]  # the samples Lightning's DistributedSampler(shuffle=True, seed=0) gives each rank, epoch by epoch
    for rank in range(2):
        sampler = DistributedSampler(TensorDataset(inputs), num_replicas=2, rank=rank, shuffle=True, seed=0)
        for epoch in range(-(-STEPS * BATCH // len(sampler))):
            sampler.set_epoch(epoch)
            order[rank] += list(sampler)
    losses = [[], []]
    for step in range(STEPS):
        gradients = []
        for rank in range(2):
            batch = torch.tensor(order[rank][step * BATCH:(step + 1) * BATCH])
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(module.out(torch.relu(module.hidden(inputs[batch]))), targets[batch])
            loss.backward()
            losses[rank].append(loss.detach())
            gradients.append([p.grad.clone() for p in module.parameters()])
        for p, g0, g1 in zip(module.parameters(), *gradients):
            p.grad = g0 / 2 + g1 / 2
        optimizer.step()
    for rank, result in enumerate(ranks):
        assert_bitwise(list(result["losses"]), losses[rank])
        assert_bitwise(result["params"], parameters(module))


# ---------------------------------------------------------------- bad configurations get clear errors
def test_one_device_without_the_strategy_stops_with_the_fix():
    with pytest.raises(MisconfigurationException, match="strategy='single_neuron'"):
        fit(accelerator="neuron", devices=1)


def test_lightnings_ddp_strategy_stops_with_the_fix():
    run = trainer(accelerator="neuron", devices=2)
    assert type(run.strategy) is DDPStrategy
    with pytest.raises(MisconfigurationException, match="strategy='ddp_neuron'"):
        run.accelerator.setup(run)


# ---------------------------------------------------------------- Lightning 2.6's gaps
def test_gap_auto_chooses_the_cpu():
    assert torch.neuron.is_available()
    gap_still_there(isinstance(trainer().accelerator, CPUAccelerator),
                    'Trainer(accelerator="auto") chooses the CPU although neuron is available')


def test_gap_one_device_gets_a_cpu_strategy():
    strategy = trainer(accelerator="neuron", devices=1).strategy
    gap_still_there(type(strategy) is SingleDeviceStrategy and strategy.root_device == torch.device("cpu"),
                    'Trainer(accelerator="neuron", devices=1) gets SingleDeviceStrategy("cpu")')


def test_gap_ddp_strategy_needs_cuda():
    strategy = trainer(accelerator="neuron", devices=2).strategy
    gap_still_there(type(strategy) is DDPStrategy and strategy.determine_ddp_device_ids() == [0],
                    'Trainer(accelerator="neuron", devices=2) gets DDPStrategy with device ids')
    with pytest.raises(RuntimeError) as raised:
        strategy._setup_model(torch.nn.Linear(2, 2).to("neuron"))  # no process group: DDP itself would refuse
    gap_still_there("requires CUDA support" in str(raised.value),
                    f"DDPStrategy wraps the model in a CUDA stream (now: {raised.value})")


def test_gap_mixed_precision_is_made_for_cuda():
    run = trainer(accelerator="neuron", strategy="single_neuron", precision="bf16-mixed")
    gap_still_there(run.precision_plugin.device == "cuda",
                    "Lightning's connector makes MixedPrecision(..., 'cuda') for accelerator 'neuron'")


def test_gap_no_accelerator_without_the_import(ddp_ranks):
    """Lightning reads no entry point for accelerators: in a fresh interpreter
    (lightning_ddp_script.py, before it imports torchneuron.lightning),
    Trainer(accelerator="neuron") is refused."""
    for result in ddp_ranks:
        gap_still_there(result["without_import"].startswith(
            "refused: You selected an invalid accelerator name: `accelerator='neuron'`"),
            f"Trainer(accelerator='neuron') without importing torchneuron.lightning: {result['without_import']}")
