#!/usr/bin/env python
"""Calibration of the Trainium twin: its modelled figures beside AWS's published measurements.

    .venv/bin/python benchmarks/target_calibration.py --nki-samples PATH   # all rows (about 5 min)
    .venv/bin/python benchmarks/target_calibration.py --only models        # the model rows only

Each row is one measured figure AWS published for a named model, configuration and
instance, or for a tutorial kernel with its shapes, with its source. The twin's figure
for it is modelled here:

* **models:** ``torchneuron.target.estimate`` costs one tensor-parallel rank's step of a
  Hugging Face model built on the ``meta`` device from the published hyperparameters
  (no weights). A rank holds 1/TP of the attention heads, of the MLP width and of the
  vocabulary (key/value heads replicated when fewer than TP), the whole hidden size.
  Published figures come from compiled graphs, so the compiled estimate is compared; the
  eager estimate (each operator one launch) is shown beside it. Throughput follows from
  the step: seq/s = DP x microbatch / microbatch time, with a 1F1B pipeline's bubble
  ((microbatches + PP - 1) stage times per step) where PP > 1. Tensor parallelism's
  all-reduces are added to the step (two per layer forward, two more backward, of the
  tokens' hidden states), each charged as the twin charges a collective: its latency and
  its ring traffic over NeuronLink (the traffic only where the chip's NeuronLink bandwidth
  is published: not Trainium1's). The latency is the twin's one calibrated figure, fitted
  here on the token-generation rows; each of those rows is modelled with the latency
  fitted on the others (leave one out), so its error is not zero by construction. The
  optimizer step, the data-parallel and ZeRO collectives and activation recomputation are
  not in these figures.
* **kernels:** the NKI emulator's performance model (``nki.estimate``) on the machine the
  tutorial ran on, for the tutorial's own kernel, read from an aws-neuron/nki-samples
  checkout given with ``--nki-samples`` (its code is not copied here).

Trainium1 (NeuronCore-v2) is not a twin target; its rows use the NKI emulator's
NeuronCore-v2 figures with the twin's Trainium2 per-launch cost. Writes
benchmarks/target_calibration.md.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from torchneuron.nki.machine import MACHINES  # noqa: E402
from torchneuron.target import figures  # noqa: E402
from torchneuron.target.estimate import Estimate, estimate_layers  # noqa: E402
from torchneuron.target.roofline import ring_seconds  # noqa: E402

# -- sources -------------------------------------------------------------------------------
# The aws-neuron-sdk repository (the source of AWS's Neuron documentation site) at the
# commit read, and the nki-samples commit whose tutorial kernels were run.
SDK = "https://github.com/aws-neuron/aws-neuron-sdk/blob/81ce03ae261e12925e53437a0f690478e6366155"
SOURCES = {
    "nxdi-70b": (f"{SDK}/libraries/nxd-inference/tutorials/trn2-llama3.3-70b-tutorial.rst",
                 "NxD Inference tutorial, Llama-3.3-70B on Trn2, scenario 1 (BF16, no speculative decoding), "
                 "LLMPerf P50; its results table is llama70b_perf_comparison.csv beside it (2025-02-04)"),
    "nxdi-405b": (f"{SDK}/libraries/nxd-inference/tutorials/trn2-llama3.1-405b-speculative-tutorial.rst",
                  "NxD Inference tutorial, Llama-3.1-405B on Trn2, part 1 (BF16, no speculative decoding), "
                  "LLMPerf P50; its results table is llama405b_perf_comparison.csv beside it (2025-02-04)"),
    "vllm-8b": (f"{SDK}/vllm-neuron/docs/tutorials/tutorial-eagle3-speculative-decoding-llama-3-1.md",
                "vLLM Neuron EAGLE3 tutorial, Llama-3.1-8B-Instruct baseline (no speculation), "
                "vllm bench serve median TPOT, Neuron SDK 2.32 or later (2026-08-17)"),
    "trn1-train": (f"{SDK}/about-neuron/benchmarks/trn1/training_data_decoder.csv",
                   "Trn1/Trn1n training performance tables (training_data_decoder.csv, 2025-10-17, and "
                   "training_data_encoder.csv, 2025-12-19, beside it); rendered on the Neuron docs site as "
                   "'Trn1/Trn1n Training Performance'"),
    "trn1-infer": (f"{SDK}/about-neuron/benchmarks/trn1/latency_data_decoder.csv",
                   "Trn1 inference performance, decoder tables (latency_data_decoder.csv and "
                   "throughput_data_decoder.csv), Neuron 2.18.1"),
    "mamba": (f"{SDK}/nki/guides/tutorials/fused_mamba.rst",
              "NKI tutorial 'Fused Mamba', kernel timings from the profiler; its figures are unchanged since "
              "its first publication with Neuron SDK 2.20 (2024-09-16), before Trainium2 shipped: "
              "NeuronCore-v2. Kernels: aws-neuron/nki-samples 6905a68 (2026-02-10), "
              "src/nki_samples/tutorials/fused_mamba"),
}

# -- published hyperparameters (model cards: Meta's Llama 3/3.1/3.3, Google's BERT-Large) ------
LLAMA = {
    "8B": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256),
    "70B": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, vocab_size=128256),
    "405B": dict(hidden_size=16384, intermediate_size=53248, num_hidden_layers=126, num_attention_heads=128,
                 num_key_value_heads=8, vocab_size=128256),
}
BERT_LARGE = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                  vocab_size=30522)


class NeuronCoreV2(figures.LogicalCore):
    """One Trainium1 NeuronCore: the NKI emulator's NeuronCore-v2 figures. The twin has no
    Trainium1 launch cost; the Trainium2 one stands in (one launch per compiled graph)."""

    @property
    def launch_s(self) -> float:
        return figures.LAUNCH_US["trn2"] * 1e-6


def core_for(chip: str):
    return NeuronCoreV2(MACHINES["trn1"], 1) if chip == "trn1" else figures.logical_core(chip, 2)


# -- one tensor-parallel rank of a model, on the meta device ---------------------------------
def llama_rank(size: str, tp: int):
    """A builder of one TP rank of a Llama: ``build(layers)`` -> LlamaForCausalLM on meta, bf16."""
    from transformers import LlamaConfig, LlamaForCausalLM

    h = LLAMA[size]
    cfg = dict(hidden_size=h["hidden_size"], intermediate_size=h["intermediate_size"] // tp,
               num_attention_heads=h["num_attention_heads"] // tp,
               num_key_value_heads=max(1, h["num_key_value_heads"] // tp),
               head_dim=h["hidden_size"] // h["num_attention_heads"],
               vocab_size=math.ceil(h["vocab_size"] / tp), max_position_embeddings=131072,
               rope_theta=500000.0, attn_implementation="eager")

    def model(layers: int):
        with torch.device("meta"):
            return LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers, **cfg)).to(torch.bfloat16)

    return model, h["num_hidden_layers"]


def prefill(size: str, tp: int, tokens: int, batch: int = 1):
    """Context encoding: the prompt's forward, logits of its last position only."""
    make, layers = llama_rank(size, tp)
    ids = torch.zeros(batch, tokens, dtype=torch.long, device="meta")
    return (lambda n: (make(n), {"input_ids": ids, "use_cache": False, "logits_to_keep": 1})), layers, False


def decode(size: str, tp: int, context: int, batch: int = 1):
    """One token generation step with ``context`` positions in the KV cache."""
    from transformers import DynamicCache

    make, layers = llama_rank(size, tp)

    def build(n):
        model = make(n)
        cfg = model.config
        cache = DynamicCache(config=cfg)
        for i in range(n):
            kv = torch.empty(batch, cfg.num_key_value_heads, context, cfg.head_dim, device="meta",
                             dtype=torch.bfloat16)
            cache.update(kv, kv.clone(), i)
        ids = torch.zeros(batch, 1, dtype=torch.long, device="meta")
        return model, {"input_ids": ids, "past_key_values": cache, "use_cache": True}

    return build, layers, False


def train(size: str, tp: int, tokens: int, batch: int = 1):
    """Forward and backward of one microbatch with the language-model loss."""
    make, layers = llama_rank(size, tp)
    ids = torch.zeros(batch, tokens, dtype=torch.long, device="meta")
    return (lambda n: (make(n), {"input_ids": ids, "labels": ids, "use_cache": False})), layers, True


def bert_train(tokens: int, batch: int):
    """BERT-Large pre-training (masked LM and next sentence) forward and backward, bf16."""
    from transformers import BertConfig, BertForPreTraining

    def build(n):
        with torch.device("meta"):
            model = BertForPreTraining(BertConfig(num_hidden_layers=n, attn_implementation="eager",
                                                  **{k: v for k, v in BERT_LARGE.items()
                                                     if k != "num_hidden_layers"})).to(torch.bfloat16)
        ids = torch.zeros(batch, tokens, dtype=torch.long, device="meta")
        return model, {"input_ids": ids, "labels": ids,
                       "next_sentence_label": torch.zeros(batch, dtype=torch.long, device="meta")}

    return build, BERT_LARGE["num_hidden_layers"], True


# -- the figures ----------------------------------------------------------------------------
@dataclass
class Figure:
    name: str
    chip: str             # trn2, trn3 or trn1
    config: str           # the published configuration, in short
    measured: float
    unit: str             # "ms" (a latency) or "seq/s" (a throughput)
    source: str           # key of SOURCES
    step: tuple = None    # (build, layers, backward) for a model row
    per_step: callable = None  # microbatch seconds -> the figure in its unit
    kernel: tuple = None  # (module path in nki-samples, function, shapes (batch, channels, seq, state))
    collectives: tuple = None  # tensor parallelism's all-reduces per step: (count, bytes each, ranks)


def tp_allreduces(size: str, tp: int, tokens: int, batch: int = 1, backward: bool = False) -> tuple:
    """Megatron-style tensor parallelism's all-reduces in one rank's step: the attention's and
    the MLP's outputs in each layer (and their gradients backward), batch x tokens x hidden, bf16."""
    h = LLAMA[size]
    return 2 * h["num_hidden_layers"] * (2 if backward else 1), batch * tokens * h["hidden_size"] * 2, tp


def ms(seconds: float) -> float:
    return seconds * 1e3


def training_rate(dp: int, microbatch: int, microbatches: int = 1, pp: int = 1):
    """seq/s from one rank's microbatch time: with PP stages each rank does 1/PP of the layers,
    and a step of M microbatches takes (M + PP - 1) stage times (1F1B)."""
    def rate(model_s: float) -> float:
        stage = model_s / pp
        step = (microbatches + pp - 1) * stage
        return dp * microbatches * microbatch / step
    return rate


FIGURES = [
    Figure("Llama-3.3-70B TTFT", "trn2", "trn2.48xlarge, TP=64, LNC=2, BF16, batch 1, 10,000-token prompt "
           "(context bucket 12,288)", 814.2, "ms", "nxdi-70b", step=prefill("70B", 64, 12288), per_step=ms,
           collectives=tp_allreduces("70B", 64, 12288)),
    Figure("Llama-3.3-70B TPOT", "trn2", "as above; generation bucket 12,800", 19.6, "ms", "nxdi-70b",
           step=decode("70B", 64, 12800), per_step=ms, collectives=tp_allreduces("70B", 64, 1)),
    Figure("Llama-3.1-405B TTFT", "trn2", "trn2.48xlarge, TP=64, LNC=2, BF16, batch 1, 10,000-token prompt "
           "(context bucket 10,240)", 2442.0, "ms", "nxdi-405b", step=prefill("405B", 64, 10240), per_step=ms,
           collectives=tp_allreduces("405B", 64, 10240)),
    Figure("Llama-3.1-405B TPOT", "trn2", "as above; generation bucket 12,800", 37.9, "ms", "nxdi-405b",
           step=decode("405B", 64, 12800), per_step=ms, collectives=tp_allreduces("405B", 64, 1)),
    Figure("Llama-3.1-8B TPOT (median)", "trn2", "trn2.48xlarge, vLLM, TP=8, 2 concurrent requests, "
           "512-token prompts, 128 output tokens (context about 576)", 10.52, "ms", "vllm-8b",
           step=decode("8B", 8, 576, batch=2), per_step=ms,
           collectives=tp_allreduces("8B", 8, 1, batch=2)),
    Figure("Llama-3.1-8B pre-training", "trn1", "32 x trn1.32xlarge, TP=32 DP=32 ZeRO-1, microbatch 1, "
           "global batch 1024, seq 8192, BF16 autocast, Neuron 2.24", 47.95, "seq/s", "trn1-train",
           step=train("8B", 32, 8192), per_step=training_rate(dp=32, microbatch=1, microbatches=32),
           collectives=tp_allreduces("8B", 32, 8192, backward=True)),
    Figure("Llama-3.1-70B pre-training", "trn1", "32 x trn1.32xlarge, TP=32 DP=4 PP=8, microbatch 1, "
           "global batch 1024, seq 8192, BF16 autocast, Neuron 2.24", 7.94, "seq/s", "trn1-train",
           step=train("70B", 32, 8192), per_step=training_rate(dp=4, microbatch=1, microbatches=256, pp=8),
           collectives=tp_allreduces("70B", 32, 8192, backward=True)),
    Figure("BERT-Large phase-1 pre-training", "trn1", "1 x trn1.32xlarge, 32 NeuronCores DP, microbatch 16, "
           "seq 128, BF16 autocast, Neuron 2.28", 3826.6, "seq/s", "trn1-train",
           step=bert_train(128, 16), per_step=training_rate(dp=32, microbatch=16)),
    Figure("Llama-3-70B TTFT (P50)", "trn1", "trn1.32xlarge, transformers-neuronx, TP=32, batch 1, "
           "2048-token prompt, BF16, Neuron 2.18.1", 547.0, "ms", "trn1-infer",
           step=prefill("70B", 32, 2048), per_step=ms,
           collectives=tp_allreduces("70B", 32, 2048)),
    Figure("Llama-3-70B TPOT (P50)", "trn1", "as above; 2048 output tokens (mean context about 3072)",
           26.2, "ms", "trn1-infer", step=decode("70B", 32, 3072), per_step=ms,
           collectives=tp_allreduces("70B", 32, 1)),
    Figure("Llama-3-70B TPOT (P50), batch 4", "trn1", "trn1.32xlarge, TP=32, batch 4, 2048 in / 2048 out",
           32.33, "ms", "trn1-infer", step=decode("70B", 32, 3072, batch=4), per_step=ms,
           collectives=tp_allreduces("70B", 32, 1, batch=4)),
    Figure("mamba_v1, 256 channels", "trn1", "one NeuronCore, fp32, batch 1, seq 512, state 16", 172.93, "us",
           "mamba", kernel=("mamba_v1", (1, 256, 512, 16))),
    Figure("mamba_v1, 4096 channels", "trn1", "one NeuronCore, fp32, batch 1, seq 512, state 16", 2340.0, "us",
           "mamba", kernel=("mamba_v1", (1, 4096, 512, 16))),
    Figure("mamba_v2, 4096 channels", "trn1", "one NeuronCore, fp32, batch 1, seq 512, state 16", 1610.0, "us",
           "mamba", kernel=("mamba_v2", (1, 4096, 512, 16))),
    Figure("mamba_v3, seq 2048", "trn1", "one NeuronCore, fp32, batch 1, 4096 channels, state 16", 6600.0, "us",
           "mamba", kernel=("mamba_v3", (1, 4096, 2048, 16))),
    Figure("mamba_v3, seq 8192", "trn1", "one NeuronCore, fp32, batch 1, 4096 channels, state 16", 27800.0,
           "us", "mamba", kernel=("mamba_v3", (1, 4096, 8192, 16))),
]


# -- modelling ------------------------------------------------------------------------------
def model_row(fig: Figure) -> dict:
    build, layers, backward = fig.step
    est: Estimate = estimate_layers(build, layers, backward=backward, core=core_for(fig.chip))
    bounds, engines = {}, {}
    for g in est.graphs:
        bounds[g.bound] = bounds.get(g.bound, 0.0) + g.seconds
        for engine, seconds in g.engine_s.items():
            engines[engine] = engines.get(engine, 0.0) + seconds
    return {"modelled": fig.per_step(est.compiled_s), "eager": fig.per_step(est.eager_s),
            "launches": est.eager_launches, "flops": est.compiled_flops, "engines": engines,
            "compiled_s": est.compiled_s, "eager_s": est.eager_s, "layers": layers, "collective_s": 0.0,
            "bound": max(bounds, key=bounds.get) if bounds else ""}


def per_collective_gap(fig: Figure, r: dict) -> float:
    """A token-generation row's measured minus modelled (one rank, no collectives) time, per
    tensor-parallel collective, in seconds."""
    return (fig.measured - r["modelled"]) * 1e-3 / fig.collectives[0]


def add_collectives(rows: list) -> float:
    """Adds tensor parallelism's all-reduces to the model rows (in place) and returns the
    latency fitted on all token-generation rows: the median of their gaps per collective.
    A token-generation row itself gets the median of the other rows' gaps."""
    import statistics

    decode = [(f, r) for f, r in rows if r is not None and f.collectives and "TPOT" in f.name]
    gaps = {f.name: per_collective_gap(f, r) for f, r in decode}
    for f, r in rows:
        if r is None or not f.collectives:
            continue
        others = [g for name, g in gaps.items() if name != f.name] or list(gaps.values())
        latency = statistics.median(others) if others else 0.0
        count, nbytes, ranks = f.collectives
        core = core_for(f.chip)
        traffic = ring_seconds(2, nbytes, ranks, core) if f.chip in figures.LINK_BYTES_PER_S else 0.0
        if f.name in gaps:
            r["gap_s"] = gaps[f.name]
        r["collective_s"] = count * (latency + traffic)
        r["latency_s"] = latency
        r["modelled"] = f.per_step(r["compiled_s"] + r["collective_s"])
        r["eager"] = f.per_step(r["eager_s"] + r["collective_s"])
    return statistics.median(gaps.values()) if gaps else 0.0


MAMBA_KERNELS = "src/nki_samples/tutorials/fused_mamba/mamba_nki_kernels.py"


def _kernel_module(samples: str):
    """The tutorial's kernel module from an nki-samples checkout (or a bare git directory)."""
    path = os.path.join(samples, MAMBA_KERNELS)
    if not os.path.exists(path):  # a bare repository: read the file from its HEAD
        text = subprocess.run(["git", "--git-dir", samples, "show", f"HEAD:{MAMBA_KERNELS}"],
                              check=True, capture_output=True, text=True).stdout
        path = os.path.join(tempfile.mkdtemp(), "mamba_nki_kernels.py")
        with open(path, "w") as f:
            f.write(text)
    import torchneuron.nki as nki

    nki.install_import_aliases()
    spec = importlib.util.spec_from_file_location("mamba_nki_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernel_row(fig: Figure, module) -> dict:
    import numpy as np

    import torchneuron.nki as nki

    name, (batch, channels, seq, state) = fig.kernel
    delta = np.ones((batch, channels, seq), np.float32)
    a = -np.ones((channels, state), np.float32)
    bc = np.ones((batch, state, seq), np.float32)
    report = nki.estimate(getattr(module, name), delta, delta, a, bc, bc, machine=fig.chip)
    busiest = max(report.engines, key=lambda e: report.engines[e].get("busy", 0.0))
    return {"modelled": report.latency_us, "eager": None, "bound": f"{busiest} engine"}


# -- the report -----------------------------------------------------------------------------
def fmt(x: float) -> str:
    return "-" if x is None else f"{x:,.4g}" if abs(x) < 1e4 else f"{x:,.0f}"


def write(rows: list, path: str, elapsed: float, latency_s: float) -> None:
    lines = [
        "# The Trainium twin against published measurements",
        "",
        f"Generated by `benchmarks/target_calibration.py` on {datetime.date.today().isoformat()} "
        f"({elapsed:.0f} s). Each measured figure is AWS's, from the source named; each modelled "
        "figure is the twin's (`torchneuron/target`), for the same model, shapes and configuration, "
        "on one logical core of the chip (one tensor-parallel rank). **Modelled / measured** is the "
        "ratio of the figures as published: for a latency, below 1 means the model is too fast; for a "
        "throughput (seq/s), above 1 means the model is too fast. **Error** is modelled minus measured, "
        "over measured. The eager column is the same step with each operator its own launch; AWS's "
        "figures are all from compiled graphs. **TP collectives** is the part of the modelled figure "
        "that tensor parallelism's all-reduces take, per step, and the latency each was charged: "
        "token-generation rows the latency fitted on the other such rows, the rest the latency fitted "
        f"on all of them ({latency_s * 1e6:.0f} us; the twin's `COLLECTIVE_LATENCY_US` is this figure).",
        "",
        "| figure | chip | configuration | measured | modelled | modelled / measured | error | "
        "eager (modelled) | TP collectives (latency) | bound (model) | source |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for fig, r in rows:
        url, _ = SOURCES[fig.source]
        if r is None:
            lines.append(f"| {fig.name} | {fig.chip} | {fig.config} | {fmt(fig.measured)} {fig.unit} | not run | | | "
                         f"| | | [{fig.source}]({url}) |")
            continue
        ratio = r["modelled"] / fig.measured
        collectives = (f"{fmt(r['collective_s'] * 1e3)} ms ({r['latency_s'] * 1e6:.0f} us)"
                       if r.get("latency_s") is not None else "-")
        lines.append(
            f"| {fig.name} | {fig.chip} | {fig.config} | {fmt(fig.measured)} {fig.unit} | "
            f"{fmt(r['modelled'])} {fig.unit} | {ratio:.2f} | {100 * (ratio - 1):+.0f}% | "
            f"{fmt(r['eager'])}{' ' + fig.unit if r['eager'] is not None else ''} | {collectives} | {r['bound']} | "
            f"[{fig.source}]({url}) |")
    lines += ["", "## Sources", ""]
    for key, (url, what) in SOURCES.items():
        lines.append(f"* **{key}**: {what}. <{url}>")
    lines += ["", "## What the errors say", ""]
    for paragraph in reading(rows, latency_s):
        lines += [paragraph, ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def reading(rows: list, latency_s: float) -> list:
    """The paragraphs under the table: what the errors say, with this run's numbers."""
    done = [(f, r) for f, r in rows if r is not None]
    decode = [(f, r) for f, r in done if "TPOT" in f.name]
    graphs = [(f, r) for f, r in done if r.get("engines") and "TPOT" not in f.name]
    kernels = [(f, r) for f, r in done if f.kernel]
    def slower(items):  # measured latency over modelled: how many times too fast the model is
        ratios = [f.measured / r["modelled"] for f, r in items]
        return f"{min(ratios):.1f} to {max(ratios):.1f}"

    def error(f, r):
        return f"{100 * (r['modelled'] / f.measured - 1):+.0f}%"

    prefill = [(f, r) for f, r in graphs if "TTFT" in f.name]
    llama_training = [(f, r) for f, r in graphs if "Llama" in f.name and f.unit == "seq/s"]
    out = []
    if decode:
        gaps = ", ".join(f"{r['gap_s'] * 1e6:.0f} us ({f.name}, {f.chip})" for f, r in decode)
        one_rank = [f.measured / (r["compiled_s"] * 1e3) for f, r in decode]
        out.append(
            "**Token generation (TPOT) fits the collective latency.** One rank's decode step is "
            "memory-bound in the model: it reads its share of the weights and its KV cache at the chip's "
            "HBM bandwidth. Without tensor parallelism's all-reduces (two per layer) it is "
            f"{min(one_rank):.1f} to {max(one_rank):.1f} times too fast, and their traffic cannot close the "
            "gap: one token's hidden state is a few kilobytes (Llama-70B, TP=64: "
            f"{ring_seconds(2, 8192 * 2, 64, core_for('trn2')) * 1e6:.2f} us at NeuronLink's bandwidth). "
            f"Spread over those collectives, measured minus modelled is {gaps}: one size across two chips, "
            "TP from 8 to 64 and batch 1 or 4, while the memory time ranges over "
            f"{min(r['compiled_s'] for _, r in decode) * 1e3:.1f} to "
            f"{max(r['compiled_s'] for _, r in decode) * 1e3:.1f} ms with the bytes a rank reads. A gap that "
            "does not follow the bytes is a latency per collective, not a bandwidth error. The twin's "
            f"`COLLECTIVE_LATENCY_US` is their median ({latency_s * 1e6:.0f} us). The gap also holds the "
            "serving loop's per-token work (sampling, scheduling), which the measurements include, so the "
            "figure is an upper estimate of the hardware's latency. Each row is modelled with the median of "
            "the other rows' gaps: " + ", ".join(f"{f.name} ({f.chip}) {error(f, r)}" for f, r in decode)
            + ". The model also overstates decode memory a little: Hugging Face's cache concatenates, "
            "so the graph writes the whole KV cache each token where NxD Inference writes one position.")
    if graphs:
        parts = []
        for f, r in graphs:
            e = r["engines"]
            parts.append(f"{f.name} {e.get('vector', 0) / max(e.get('tensor', 0), 1e-12):.1f}x")
        out.append(
            "**Prefill and training are compute-bound in the model, and the VectorEngine weighs as much "
            "as the TensorEngine or more** (VectorEngine time over TensorEngine time: "
            + "; ".join(parts) + "). A compiled graph's engine time is each node's work summed "
            "(`roofline.graph_cost`), so the element-wise chain of attention over the S x S scores (mask, "
            "max, subtract, divide, dtype casts: one pass each, fp32 at the fp32 rate) is charged pass by "
            "pass, where Neuron's compiler and its attention kernels fuse it into a few passes. That "
            "overcount is what brings the trn1 Llama training rows near the measurement ("
            + ", ".join(error(f, r) for f, r in llama_training) + "): it "
            "offsets what the model omits (on Trainium1 the TP collectives' traffic, whose NeuronLink-v2 "
            "bandwidth AWS does not publish; ZeRO-1's gradient reduce-scatter, the optimizer step, activation "
            "recomputation). The agreement is not evidence that the constants are right. "
            f"Prefill (TTFT) is still {slower(prefill)} times too fast with that overcount and the TP "
            "collectives (their traffic included on Trainium2), so the TensorEngine does not run at its peak "
            "there: the model assumes every matmul does, whatever its shape. "
            + "".join(f"{f.name} is modelled {error(f, r)} off: small matmuls (hidden 1024, sequence 128) "
                      "assumed at peak, the data-parallel all-reduce and the optimizer unmodelled."
                      for f, r in graphs if "BERT" in f.name))
    if kernels:
        ratios = ", ".join(f"{r['modelled'] / f.measured:.1f}x" for f, r in kernels)
        by_name = {f.name: (f, r) for f, r in kernels}
        v1, v2 = by_name.get("mamba_v1, 4096 channels"), by_name.get("mamba_v2, 4096 channels")
        reorder = ""
        if v1 and v2:
            gain = 100 * (1 - v2[1]["modelled"] / v1[1]["modelled"])
            reorder = (f"It shows {'no' if abs(gain) < 0.5 else f'a {gain:.0f}%'} gain from mamba_v2's loop "
                       f"reordering, measured {100 * (1 - v2[0].measured / v1[0].measured):.0f}% faster than "
                       "v1: in the model the VectorEngine, not DMA, is the limit. ")
        out.append(
            "**The NKI performance model is pessimistic on these NeuronCore-v2 kernels** (modelled over "
            f"measured: {ratios}), all VectorEngine-bound in the model. " + reorder +
            "The kernels' Vector work is two-input fp32 instructions (tensor_tensor, tensor_tensor_scan, "
            "the += accumulation), which the model charges one cycle per element per input "
            "(docs/nki.md); the measurements suggest NeuronCore-v2 does them faster. This is the "
            "emulator's instruction model, apart from the twin's roofline.")
    out.append(
        "**Not calibrated by any row:** the per-launch cost (15 us, assumed): AWS publishes no eager "
        "figure for TorchNeuron, and every measured figure here comes from compiled graphs (one launch "
        "per step or per token), where it does not show. The eager column is the twin's figure for the "
        "same step launched operator by operator. Trainium3: no measured figure was found. Trainium2 "
        "training: no measured throughput was found.")
    return out


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nki-samples", help="an aws-neuron/nki-samples checkout (or bare git directory) for the "
                                         "kernel rows; without it they are not run")
    p.add_argument("--only", choices=("models", "kernels"), help="run only these rows")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "target_calibration.md"))
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    start = time.time()
    module = _kernel_module(args.nki_samples) if args.nki_samples and args.only != "models" else None
    rows = []
    for fig in FIGURES:
        t = time.time()
        if fig.kernel:
            r = kernel_row(fig, module) if module is not None and args.only != "models" else None
        else:
            r = model_row(fig) if args.only != "kernels" else None
        rows.append((fig, r))
        shown = "not run" if r is None else f"modelled {fmt(r['modelled'])} {fig.unit}"
        print(f"{fig.name} ({fig.chip}): measured {fmt(fig.measured)} {fig.unit}, {shown} "
              f"[{time.time() - t:.0f} s]", flush=True)
    latency_s = add_collectives(rows)
    write(rows, args.out, time.time() - start, latency_s)
    print(f"wrote {args.out}")
    return rows


if __name__ == "__main__":
    main()
