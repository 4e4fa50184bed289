"""TorchTitan's Llama 3 debug model (6 layers, dimension 256, vocabulary 2048, FlexAttention with
document masks): one training step on `neuron` against the same step on the CPU, in this process,
devices alternating step by step, medians.

    .venv/bin/python -m benchmarks.torchtitan_step [--smoke]

The step is the one TorchTitan's trainer runs in one process (`--module llama3 --config
llama3_debugmodel`), built from TorchTitan's own parts: its config, its parallelize function (selective
activation checkpointing, FSDP2 on a one-rank mesh with bfloat16 compute), its weight initialisation,
chunked cross-entropy, AdamW, warm-up and linear decay, and gradient clipping. A one-rank process group
(gloo for the CPU, `neuron` for `neuron`) gives FSDP2 its meshes, as torchrun's one process would.

Three models from the same weights, stepped in turn on the same batch:
- `neuron` as TorchTitan runs it: FlexAttention compiled (Inductor, docs/flex_attention.md);
- `neuron`, FlexAttention eager: the same computation as the CPU's, its losses checked bit for bit;
- the CPU, FlexAttention eager: PyTorch has no CPU FlexAttention backward, compiled or not, so the
  CPU runs it as the tests' reference does (tests/ecosystem/torchtitan_launch.py).
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import warnings

import torch
import torch.distributed as dist

from .common import CPU, NEURON, Config, fmt_time, median, timed

STEPS = 1

# Compiled FlexAttention (Inductor's dense decomposition for training) against the eager one sums
# scores and softmax in another order; tests/ecosystem/test_torchtitan.py's COMPILED_FLEX_RTOL.
COMPILED_FLEX_RTOL = 1e-4


def shape(cfg: Config) -> dict:
    # TorchTitan's own debug run is 8 x 2048 tokens; the CPU's eager FlexAttention materialises every
    # score, so the full size here is the largest a few repeats of it finish in a minute or so.
    return cfg.pick(dict(batch=2, seq_len=512), dict(batch=2, seq_len=64))


@contextlib.contextmanager
def one_rank_process_group():
    """A process group of this process alone, for FSDP2's one-rank meshes (none is left behind)."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("cpu:gloo,neuron:neuron", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def flex_attention(compiled: bool):
    """TorchTitan calls FlexAttention through a class attribute holding its compiled function."""
    import torch.nn.attention.flex_attention as flex

    from torchtitan.models.common.attention import FlexAttention

    as_compiled = FlexAttention._compiled_flex_attn
    if not compiled:
        FlexAttention._compiled_flex_attn = flex.flex_attention
    try:
        yield
    finally:
        FlexAttention._compiled_flex_attn = as_compiled


class TitanStep:
    """One model with TorchTitan's training parts on `device`; calling it runs one step."""

    def __init__(self, device: torch.device, size: dict, dump_folder: str):
        import torchtitan.distributed.parallel_dims as parallel_dims_module
        from torchtitan.distributed import utils as dist_utils
        from torchtitan.distributed.parallel_dims import ParallelDims
        from torchtitan.models.llama3.config_registry import llama3_debugmodel

        config = llama3_debugmodel()
        config.training.seq_len, config.training.local_batch_size = size["seq_len"], size["batch"]
        spec = config.model_spec
        spec.model.update_from_config(config=config)
        # ParallelDims builds its meshes on TorchTitan's device type, chosen once per process.
        chosen = parallel_dims_module.device_type
        parallel_dims_module.device_type = device.type
        try:
            parallel_dims = ParallelDims.from_config(config.parallelism, 1)
            parallel_dims.build_mesh()
        finally:
            parallel_dims_module.device_type = chosen
        with torch.device("meta"):
            model = spec.model.build()
        model = spec.parallelize_fn(model, parallel_dims=parallel_dims, training=config.training,
                                    parallelism=config.parallelism, compile_config=config.compile,
                                    ac_config=config.activation_checkpoint, dump_folder=dump_folder)
        model.to_empty(device=device)
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        model.train()
        self.loss_fn = config.loss.build(compile_config=config.compile)
        self.loss_fn.set_lm_head(model.lm_head)
        model._skip_lm_head = True
        self.optimizers = config.optimizer.build(model_parts=[model])
        self.lr_schedulers = config.lr_scheduler.build(optimizers=self.optimizers, training_steps=10_000)
        self.context = dist_utils.get_spmd_context(parallel_dims=parallel_dims)
        self.clip = dist_utils.clip_grad_norm_
        self.max_norm = config.training.max_norm
        self.model, self.device = model, device

    def take_weights_of(self, other: "TitanStep") -> None:
        with torch.no_grad():
            for mine, theirs in zip(self.model.parameters(), other.model.parameters(), strict=True):
                mine.to_local().copy_(theirs.to_local())

    def __call__(self, batch: dict) -> torch.Tensor:
        """TorchTitan's train_step for one process and one microbatch: the batch moved from the host,
        document masks from its positions, forward and chunked loss, backward, clipping, AdamW."""
        inputs, labels, positions = (batch[k].to(self.device) for k in ("input", "labels", "positions"))
        self.optimizers.zero_grad()
        global_valid_tokens = torch.tensor(labels.numel(), device=self.device)
        with self.context():
            masks = self.model.get_attention_masks(positions=positions)
            pred = self.model(inputs, positions=positions, attention_masks=masks)
            loss, _ = self.loss_fn(pred, labels, global_valid_tokens, positions=positions)
            del pred
            loss.backward()
        self.clip(list(self.model.parameters()), self.max_norm, foreach=True)
        self.optimizers.step()
        self.lr_schedulers.step()
        return loss.detach()


def synthetic_batch(size: dict) -> dict:
    """Random tokens packed as TorchTitan's dataloader packs documents: positions restart at each
    document's start (five documents per sequence), which the document masks read."""
    g = torch.Generator().manual_seed(0)
    b, n = size["batch"], size["seq_len"]
    tokens = torch.randint(0, 2048, (b, n + 1), generator=g)
    starts = torch.zeros(b, n, dtype=torch.bool)
    starts[:, torch.randperm(n, generator=g)[:4]] = True
    starts[:, 0] = True
    index = torch.arange(n).expand(b, n)
    last_start = torch.where(starts, index, 0).cummax(dim=1).values
    return {"input": tokens[:, :-1], "labels": tokens[:, 1:], "positions": index - last_start}


def run(cfg: Config, bar) -> dict:
    from tests.ecosystem.torchtitan_launch import cpu_flex_backward_allowed

    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    warnings.filterwarnings("ignore", message="DTensor random operators may not have complete support")
    size = shape(cfg)
    batch = synthetic_batch(size)
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as dump, one_rank_process_group(), cpu_flex_backward_allowed():
        torch.manual_seed(0)
        cpu = TitanStep(CPU, size, dump)
        eager, compiled = TitanStep(NEURON, size, dump), TitanStep(NEURON, size, dump)
        eager.take_weights_of(cpu)
        compiled.take_weights_of(cpu)
        runs = {"cpu": (cpu, False), "neuron_eager_flex": (eager, False), "neuron": (compiled, True)}
        samples = {name: [] for name in runs}
        losses = {name: [] for name in runs}

        def step(name):
            model, flex_compiled = runs[name]

            def call():
                with flex_attention(flex_compiled):
                    losses[name].append(model(batch).item())
            return call

        first_s = {name: timed(step(name), model.device) for name, (model, _) in runs.items()}
        for _ in range(cfg.repeats):
            for name, (model, _) in runs.items():
                samples[name].append(timed(step(name), model.device))
    # a speed figure of a wrong computation is no figure
    assert losses["neuron_eager_flex"] == losses["cpu"], losses
    assert all(abs(a - b) <= COMPILED_FLEX_RTOL * abs(b) for a, b in zip(losses["neuron"], losses["cpu"])), losses
    assert losses["cpu"][-1] < losses["cpu"][0], losses  # it trains
    bar.update(1)
    out = {"shape": size, "load_average_start_end": [load_start, os.getloadavg()[0]], "first_step_s": first_s,
           "losses": losses}
    out |= {f"{name}_s": median(s) for name, s in samples.items()}
    out |= {f"{name}_samples_s": s for name, s in samples.items()}
    out["speed_vs_cpu"] = out["cpu_s"] / out["neuron_s"]
    out["eager_flex_speed_vs_cpu"] = out["cpu_s"] / out["neuron_eager_flex_s"]
    return out


def markdown(r: dict) -> str:
    s = r["shape"]
    load = r["load_average_start_end"]
    rows = [("`neuron`, as TorchTitan runs it (FlexAttention compiled)", r["neuron_s"], r["speed_vs_cpu"]),
            ("`neuron`, FlexAttention eager (the CPU's computation, bit for bit)", r["neuron_eager_flex_s"],
             r["eager_flex_speed_vs_cpu"])]
    lines = [
        "## TorchTitan Llama 3 debug model, training step",
        "",
        f"TorchTitan's `llama3_debugmodel` (6 layers, dimension 256, vocabulary 2048), batch {s['batch']} x "
        f"{s['seq_len']} tokens in five documents each, one process: TorchTitan's own parts (selective activation "
        "checkpointing, FSDP2 on one rank with bfloat16 compute, chunked cross-entropy, AdamW, clipping) built "
        "in one process, the three models from the same weights stepped in turn on the same batch, medians per "
        "step (`benchmarks/torchtitan_step.py`). The CPU runs FlexAttention eagerly (PyTorch has no CPU FlexAttention "
        "backward); its losses equal eager `neuron`'s bit for bit and compiled `neuron`'s within "
        f"{COMPILED_FLEX_RTOL:g} relative (checked by the run). Load average (1 min) at the group's start / end: "
        f"{load[0]:.1f} / {load[1]:.1f}.",
        "",
        "| step | CPU | neuron | neuron speed / CPU |",
        "|---|---|---|---|",
    ]
    for name, t, speed in rows:
        lines.append(f"| {name} | {fmt_time(r['cpu_s'])} | {fmt_time(t)} | {speed:.2f} |")
    first = r["first_step_s"]
    lines += ["", f"First step (FlexAttention's compilation included on `neuron`): CPU {fmt_time(first['cpu'])}, "
              f"`neuron` eager {fmt_time(first['neuron_eager_flex'])}, compiled {fmt_time(first['neuron'])}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    from .common import run_alone

    run_alone("torchtitan", run, lambda res: [])
