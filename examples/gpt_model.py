"""A small character-level GPT and a device-agnostic training loop.

Used by ``examples/train_gpt.py`` (the demo) and ``tests/test_demo_model.py``
(model parity between the ``neuron`` device and the CPU).

Everything here is plain, device-agnostic PyTorch: the device is only ever a
``torch.device`` built from a string, synchronisation and memory statistics go
through ``torch.accelerator``, and nothing is CUDA-specific.

Reproducibility across devices
------------------------------
Losses on two devices agree only if both runs see the same numbers, so
everything random is drawn on the CPU from explicit ``torch.Generator``
objects and then moved to the device:

* parameters are created and initialised on the CPU (generator seeded with
  ``seed``) and then moved with ``model.to(device)``;
* training batches are sampled on the CPU (generator seeded with ``seed + 1``);
* the training text is generated procedurally from a small grammar with
  ``random.Random(corpus_seed)``; nothing is downloaded.

Dropout is the one exception: it draws from the *device's* generator, which is
by design independent of the CPU generator.  With ``dropout > 0`` each device
is reproducible run to run, but device and CPU losses differ.  Parity runs
therefore use the default ``dropout=0.0``.
"""

from __future__ import annotations

import ctypes
import gc
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "GPTConfig",
    "GPT",
    "TrainConfig",
    "TrainResult",
    "CharTokenizer",
    "make_corpus",
    "load_dataset",
    "train",
    "generate",
    "save_checkpoint",
    "load_checkpoint",
    "count_parameters",
    "lr_at",
]


# ---------------------------------------------------------------------------
# Text: a procedurally generated corpus (no downloads, fixed seed)
# ---------------------------------------------------------------------------

_NAMES = ["ada", "bram", "cleo", "dov", "edda", "finn", "gale", "hugo",
          "iris", "juno", "kai", "lena", "milo", "nora", "otto", "pia"]
_ADJS = ["quick", "lazy", "quiet", "bright", "small", "old", "brave",
         "sleepy", "clever", "gentle", "red", "green", "tall", "happy"]
_NOUNS = ["fox", "dog", "cat", "owl", "boat", "lamp", "tree", "bird",
          "stone", "apple", "kite", "drum", "book", "shell"]
_VERBS = {"sees": "see", "finds": "find", "follows": "follow", "paints": "paint",
          "carries": "carry", "watches": "watch", "builds": "build",
          "greets": "greet", "hides": "hide", "draws": "draw"}
_PLACES = ["near the river", "under the old bridge", "in the garden",
           "on the hill", "by the sea", "at the market", "in the forest",
           "behind the mill"]
_TIMES = ["in the morning", "at night", "at noon", "every day",
          "in winter", "after the rain", "before supper", "on sunday"]
_FEELINGS = ["glad", "tired", "hungry", "curious", "calm", "proud"]
_NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven",
            "eight", "nine", "ten", "eleven", "twelve", "thirteen",
            "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
            "nineteen", "twenty"]


def _sentence(rng: random.Random) -> str:
    name, other = rng.sample(_NAMES, 2)
    adj, noun = rng.choice(_ADJS), rng.choice(_NOUNS)
    verb, place, when = rng.choice(sorted(_VERBS)), rng.choice(_PLACES), rng.choice(_TIMES)
    kind = rng.randrange(8)
    if kind == 0:
        return f"{name} {verb} the {adj} {noun} {place}."
    if kind == 1:
        return f"the {adj} {noun} {verb} {name} {when}."
    if kind == 2:
        return f'{name} said: "i like the {adj} {noun}, {other}."'
    if kind == 3:
        a, b = rng.randrange(11), rng.randrange(11)
        return f"{_NUMBERS[a]} plus {_NUMBERS[b]} is {_NUMBERS[a + b]}."
    if kind == 4:
        n = rng.randrange(2, 21)
        m = rng.randrange(1, n)
        return (f"{name} has {_NUMBERS[n]} {noun}s and gives {_NUMBERS[m]} "
                f"to {other}, so {name} has {_NUMBERS[n - m]} left.")
    if kind == 5:
        return f"{when}, {name} is {rng.choice(_FEELINGS)} and walks {place}."
    if kind == 6:
        return f"{name} and {other} {_VERBS[verb]} a {adj} {noun} together."
    return f"where is the {adj} {noun}? it is {place}, {name}."


@lru_cache(maxsize=4)
def make_corpus(n_chars: int = 300_000, seed: int = 1234) -> str:
    """Return about ``n_chars`` characters of grammar-generated English-like text.

    Paragraphs of 3-6 sentences separated by blank lines.  Deterministic for a
    given ``seed`` (uses its own ``random.Random``; global RNGs are untouched).
    """
    rng = random.Random(seed)
    parts: list[str] = []
    total = 0
    while total < n_chars:
        para = " ".join(_sentence(rng) for _ in range(rng.randint(3, 6)))
        parts.append(para)
        total += len(para) + 2
    return "\n\n".join(parts) + "\n"


class CharTokenizer:
    """Character-level tokenizer over the sorted set of characters in a text."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> list[int]:
        return [self.stoi[c] for c in s]

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def load_dataset(text: Optional[str] = None, val_fraction: float = 0.1):
    """Tokenise ``text`` (default: the generated corpus) into CPU int64 tensors.

    Returns ``(tokenizer, train_ids, val_ids)``.
    """
    if text is None:
        text = make_corpus()
    tok = CharTokenizer(text)
    ids = torch.tensor(tok.encode(text), dtype=torch.long)
    n_val = max(int(len(ids) * val_fraction), 1)
    return tok, ids[:-n_val], ids[-n_val:]


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------

@dataclass
class GPTConfig:
    vocab_size: int = 64
    block_size: int = 64      # context length (characters)
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    dropout: float = 0.0      # > 0 breaks device/CPU parity (device RNG), see module doc
    bias: bool = True
    tie_weights: bool = True  # output head shares the token embedding matrix
    attention: str = "explicit"  # "explicit" (matmul + mask + softmax) or "sdpa"


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.d_model % cfg.n_head:
            raise ValueError("d_model must be divisible by n_head")
        if cfg.attention not in ("explicit", "sdpa"):
            raise ValueError(f"unknown attention implementation {cfg.attention!r}")
        self.n_head = cfg.n_head
        self.head_dim = cfg.d_model // cfg.n_head
        self.attention = cfg.attention
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.attn_drop = nn.Dropout(cfg.dropout)
        self.resid_drop = nn.Dropout(cfg.dropout)
        mask = torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool).tril()
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, n_head, T, head_dim)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=True,
                dropout_p=self.dropout if self.training else 0.0)
        else:
            scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            scores = scores.masked_fill(~self.causal_mask[:T, :T], float("-inf"))
            weights = F.softmax(scores, dim=-1)
            weights = self.attn_drop(weights)
            y = torch.matmul(weights, v)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, generator: Optional[torch.Generator] = None):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        # Weight tying is done functionally in forward() (F.linear with the
        # embedding matrix) rather than by sharing a Parameter object, so it
        # cannot be undone by a device move or a state-dict round trip.
        self.lm_head = None if cfg.tie_weights else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.init_weights(generator)

    @torch.no_grad()
    def init_weights(self, generator: Optional[torch.Generator] = None) -> None:
        """GPT-2 style init, drawn from ``generator`` (CPU) in a fixed order."""
        resid_std = 0.02 / math.sqrt(2 * self.cfg.n_layer)
        for name, p in self.named_parameters():
            if name.endswith(".bias") or ".ln" in name or name.startswith("ln_f"):
                if name.endswith(".weight"):
                    p.fill_(1.0)   # layer-norm gain
                else:
                    p.zero_()
            elif name.endswith("proj.weight"):   # residual-path projections
                nn.init.normal_(p, 0.0, resid_std, generator=generator)
            else:
                nn.init.normal_(p, 0.0, 0.02, generator=generator)

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None):
        B, T = idx.shape
        if T > self.cfg.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.cfg.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        if self.lm_head is None:
            logits = F.linear(x, self.tok_emb.weight)
        else:
            logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


def print_table(names, rows) -> None:
    """Prints `rows` of (label, one value per name) as a table with a column per name."""
    w0 = max(len(r[0]) for r in rows)
    widths = [max(len(n), *(len(r[1][i]) for r in rows)) for i, n in enumerate(names)]
    line = "-" * (w0 + sum(w + 3 for w in widths))
    print(line)
    print(" " * w0 + "".join(f"   {n:>{w}}" for n, w in zip(names, widths)))
    print(line)
    for label, vals in rows:
        print(f"{label:<{w0}}" + "".join(f"   {v:>{w}}" for v, w in zip(vals, widths)))
    print(line)


def fmt_bytes(n) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def generate(model: GPT, prompt_ids: list[int], max_new_tokens: int, *,
             temperature: float = 1.0, generator: Optional[torch.Generator] = None,
             greedy: bool = False) -> list[int]:
    """Autoregressive sampling.  Logits are computed on the model's device; the
    draw happens on the CPU with ``generator`` so it is reproducible and the
    same for every device."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        ctx = torch.tensor([ids[-model.cfg.block_size:]], dtype=torch.long, device=device)
        logits, _ = model(ctx)
        last = logits[0, -1].float().cpu()
        if greedy:
            nxt = int(torch.argmax(last))
        else:
            probs = F.softmax(last / temperature, dim=-1)
            nxt = int(torch.multinomial(probs, 1, generator=generator))
        ids.append(nxt)
    model.train(was_training)
    return ids


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------

@dataclass
class TrainConfig:
    steps: int = 500
    batch_size: int = 32
    lr: float = 3e-3
    min_lr_ratio: float = 0.1     # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 30
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    grad_clip: float = 1.0
    optimizer_impl: str = "foreach"  # "foreach", "fused" or "forloop"
    log_every: int = 10            # read the loss back (a sync point) every N steps
    eval_batches: int = 8
    compile: bool = False          # torch.compile the model: backend "neuron" on neuron, Inductor on the CPU


@dataclass
class TrainResult:
    device: str
    losses: list[float]
    val_loss: float
    elapsed_s: float
    tokens_per_s: float          # steady state: excludes the first step
    peak_memory_bytes: Optional[int]
    peak_memory_kind: str
    n_params: int
    model: Optional[GPT] = field(default=None, repr=False)
    optimizer: Optional[torch.optim.Optimizer] = field(default=None, repr=False)
    tokenizer: Optional[CharTokenizer] = field(default=None, repr=False)

    def summary(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("model", "optimizer", "tokenizer")}
        d["final_loss"] = self.losses[-1] if self.losses else None
        return d


def lr_at(step: int, tc: TrainConfig) -> float:
    """Linear warmup for ``warmup_steps``, then cosine decay to ``lr*min_lr_ratio``."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    span = max(tc.steps - tc.warmup_steps, 1)
    progress = min((step - tc.warmup_steps) / span, 1.0)
    min_lr = tc.lr * tc.min_lr_ratio
    return min_lr + 0.5 * (tc.lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, tc: TrainConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tc.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    impl = {"foreach": dict(foreach=True, fused=False),
            "fused": dict(foreach=False, fused=True),
            "forloop": dict(foreach=False, fused=False)}
    if tc.optimizer_impl not in impl:
        raise ValueError(f"unknown optimizer_impl {tc.optimizer_impl!r}")
    return torch.optim.AdamW(groups, lr=tc.lr, betas=tc.betas, **impl[tc.optimizer_impl])


def get_batch(data: torch.Tensor, batch_size: int, block_size: int,
              generator: torch.Generator, device: torch.device):
    """Random contiguous windows, sampled on the CPU, then moved to ``device``."""
    starts = torch.randint(len(data) - block_size - 1, (batch_size,), generator=generator)
    offsets = torch.arange(block_size)
    x = data[starts[:, None] + offsets]
    y = data[starts[:, None] + offsets + 1]
    return x.to(device), y.to(device)


def synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


# -- memory measurement -----------------------------------------------------

def _proc_status_kib(field_name: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakMemory:
    """Peak memory of one training run.

    * Accelerator (e.g. ``neuron``): the device allocator's own counter,
      ``torch.accelerator.max_memory_allocated`` after
      ``reset_peak_memory_stats`` -- peak bytes held by live tensors.
    * CPU: PyTorch has no public CPU allocator statistics, and tracemalloc does
      not see tensor storage, so we report the growth of the process's peak
      resident set size: freed heap is first returned to the OS
      (``malloc_trim``), the kernel's high-water mark is reset (writing ``5``
      to ``/proc/self/clear_refs``), and the result is ``VmHWM`` at the end
      minus ``VmRSS`` at the start.  It is process-wide and page-granular, so
      it is an approximation (it includes allocator slack and Python objects),
      and it is ``None`` where ``/proc`` is unavailable.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.kind = ""
        self._baseline_kib: Optional[int] = None
        self._hwm_reset = False

    def start(self) -> None:
        gc.collect()
        if self.device.type != "cpu":
            self.kind = "device max_memory_allocated"
            synchronize(self.device)
            try:
                torch.accelerator.reset_peak_memory_stats(self.device)
            except Exception:  # backend without memory statistics
                self.kind = "unavailable"
            return
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._hwm_reset = True
        except OSError:
            pass
        self._baseline_kib = _proc_status_kib("VmRSS")
        self.kind = ("peak RSS growth (VmHWM)" if self._hwm_reset
                     else "peak RSS growth (VmHWM since process start)")

    def stop(self) -> Optional[int]:
        if self.device.type != "cpu":
            synchronize(self.device)
            try:
                return int(torch.accelerator.max_memory_allocated(self.device))
            except Exception:
                self.kind = "unavailable"
                return None
        hwm = _proc_status_kib("VmHWM")
        if hwm is None or self._baseline_kib is None:
            self.kind = "unavailable"
            return None
        return max(hwm - self._baseline_kib, 0) * 1024


# -- checkpoints ---------------------------------------------------------------

def save_checkpoint(path: str, model: GPT, optimizer: torch.optim.Optimizer,
                    step: int, losses: list[float], tokenizer: CharTokenizer,
                    train_config: TrainConfig) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save({
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "losses": list(losses),
        "model_config": asdict(model.cfg),
        "train_config": asdict(train_config),
        "chars": tokenizer.chars,
    }, path)


def load_checkpoint(path: str, device, optimizer_impl: Optional[str] = None):
    """Rebuild model (and optimizer) from ``path`` directly on ``device``
    (``torch.load(map_location=device)``).  Returns ``(model, optimizer, ckpt)``."""
    device = torch.device(device)
    ckpt = torch.load(path, map_location=device, weights_only=True)
    cfg = GPTConfig(**ckpt["model_config"])
    tc_dict = dict(ckpt["train_config"])
    tc_dict["betas"] = tuple(tc_dict["betas"])
    tc = TrainConfig(**tc_dict)
    if optimizer_impl is not None:
        tc.optimizer_impl = optimizer_impl
    model = GPT(cfg).to(device)
    model.load_state_dict(ckpt["model"])
    optimizer = make_optimizer(model, tc)
    optimizer.load_state_dict(ckpt["optimizer"])
    return model, optimizer, ckpt


@torch.no_grad()
def evaluate(model: GPT, data: torch.Tensor, tc: TrainConfig, seed: int,
             device: torch.device) -> float:
    """Mean loss on ``tc.eval_batches`` fixed (seeded) validation batches."""
    was_training = model.training
    model.eval()
    g = torch.Generator().manual_seed(seed + 2)
    losses = []
    for _ in range(tc.eval_batches):
        x, y = get_batch(data, tc.batch_size, model.cfg.block_size, g, device)
        losses.append(model(x, y)[1])
    model.train(was_training)
    return float(torch.stack(losses).mean().cpu())


def train(device, steps: Optional[int] = None, seed: int = 1337, *,
          model_config: Optional[GPTConfig] = None,
          train_config: Optional[TrainConfig] = None,
          text: Optional[str] = None,
          progress: bool = False, desc: Optional[str] = None,
          checkpoint_path: Optional[str] = None,
          resume_from: Optional[str] = None,
          keep_model: bool = True,
          on_log: Optional[Callable[[int, float], None]] = None,
          on_step: Optional[Callable[[int], None]] = None) -> TrainResult:
    """Train the GPT on ``device`` and return per-step losses and statistics.

    Same ``seed`` and configs => same initial weights, same batches, same
    learning-rate schedule on every device, so the loss curves are directly
    comparable.  The loop only reads the loss back every ``log_every`` steps
    (and at the end), so an asynchronous device can run ahead of Python.
    ``on_step(step)`` runs at the end of every step (a profiler's ``step()``).
    """
    device = torch.device(device)
    tc = TrainConfig(**asdict(train_config)) if train_config is not None else TrainConfig()
    if steps is not None:
        tc.steps = steps
    tc.betas = tuple(tc.betas)
    torch.manual_seed(seed)  # seeds every device generator too (dropout)

    tok, train_ids, val_ids = load_dataset(text)
    mc = GPTConfig(**asdict(model_config)) if model_config is not None else GPTConfig()
    mc.vocab_size = tok.vocab_size

    mem = PeakMemory(device)
    mem.start()

    start_step = 0
    losses: list[float] = []
    if resume_from is not None:
        model, optimizer, ckpt = load_checkpoint(resume_from, device, tc.optimizer_impl)
        if ckpt["chars"] != tok.chars:
            raise ValueError("checkpoint was trained on a different character set")
        mc = model.cfg
        start_step = ckpt["step"]
        losses = list(ckpt["losses"])
        tc.steps = start_step + tc.steps  # train `steps` more
    else:
        init_gen = torch.Generator().manual_seed(seed)
        model = GPT(mc, generator=init_gen).to(device)
        optimizer = make_optimizer(model, tc)
    model.train()
    n_params = count_parameters(model)
    step_model = model
    if tc.compile:
        step_model = torch.compile(model, backend="neuron" if device.type == "neuron" else "inductor")

    data_gen = torch.Generator().manual_seed(seed + 1)
    if start_step:  # replay the batch stream so a resumed run sees the same data
        for _ in range(start_step):
            torch.randint(len(train_ids) - mc.block_size - 1, (tc.batch_size,), generator=data_gen)
    tokens_per_step = tc.batch_size * mc.block_size

    pbar = None
    if progress:
        from tqdm.auto import tqdm
        pbar = tqdm(total=tc.steps, initial=start_step, desc=desc or str(device),
                    unit="step", dynamic_ncols=True)

    pending: list[torch.Tensor] = []
    t_start = time.perf_counter()
    t_steady = None
    t_last, step_last = t_start, start_step
    for step in range(start_step, tc.steps):
        lr = lr_at(step, tc)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = get_batch(train_ids, tc.batch_size, mc.block_size, data_gen, device)
        _, loss = step_model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if tc.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip, foreach=True)
        optimizer.step()
        pending.append(loss.detach())

        last = step == tc.steps - 1
        if step == start_step or (step + 1) % tc.log_every == 0 or last:
            values = torch.stack(pending).cpu().tolist()  # waits for these steps only
            losses.extend(values)
            pending.clear()
            loss_val = values[-1]
            now = time.perf_counter()
            if step == start_step:
                t_steady = now    # first step excluded from throughput (warm-up)
            if pbar is not None:
                rate = (step + 1 - step_last) * tokens_per_step / max(now - t_last, 1e-9)
                pbar.set_postfix(loss=f"{loss_val:.4f}", lr=f"{lr:.2e}", tok_s=f"{rate:,.0f}")
                pbar.update(step + 1 - pbar.n)
            if on_log is not None:
                on_log(step, loss_val)
            t_last, step_last = now, step + 1
        if on_step is not None:
            on_step(step)
    synchronize(device)
    t_end = time.perf_counter()
    if pbar is not None:
        pbar.close()
    peak = mem.stop()

    steady_steps = tc.steps - start_step - 1
    if steady_steps > 0 and t_steady is not None:
        tokens_per_s = steady_steps * tokens_per_step / max(t_end - t_steady, 1e-9)
    else:
        tokens_per_s = (tc.steps - start_step) * tokens_per_step / max(t_end - t_start, 1e-9)

    val_loss = evaluate(model, val_ids, tc, seed, device)
    if checkpoint_path is not None:
        save_checkpoint(checkpoint_path, model, optimizer, tc.steps, losses, tok, tc)

    return TrainResult(
        device=str(device), losses=losses, val_loss=val_loss,
        elapsed_s=t_end - t_start, tokens_per_s=tokens_per_s,
        peak_memory_bytes=peak, peak_memory_kind=mem.kind, n_params=n_params,
        model=model if keep_model else None,
        optimizer=optimizer if keep_model else None,
        tokenizer=tok)
