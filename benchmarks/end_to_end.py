"""End to end, eager: one training step of the demo GPT, of a
ResNet-18-sized network and of a recurrent word language model, and batch-1
GPT inference (one token per forward, read back to the host: latency-bound).
Same initial weights and the same batches on both devices (drawn on the CPU,
then moved)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import torchneuron

from .common import NEURON, Config, compare, fused_in_one_step

import gpt_model as gm  # noqa: E402  (on sys.path via .common)


# -- ResNet-18 in plain torch.nn (torchvision's layout: BasicBlock x [2, 2, 2, 2]) --

class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000, width: int = 64):
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 7, 2, 3, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], w
        for i, cout in enumerate((w, 2 * w, 4 * w, 8 * w)):
            layers += [BasicBlock(cin, cout, 1 if i == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# -- a word language model: embedding, a 2-layer recurrent stack, a linear decoder --

RNN_TYPES = ("LSTM", "GRU", "RNN_TANH", "RNN_RELU")


class WordLM(nn.Module):
    """Next-word prediction over a vocabulary, as pytorch/examples'
    word_language_model trains it (sequence-first batches, hidden state
    carried from one batch to the next)."""

    def __init__(self, rnn_type: str, vocab: int, emb: int, hidden: int, layers: int, dropout: float = 0.0):
        super().__init__()
        if rnn_type not in RNN_TYPES:
            raise ValueError(f"rnn_type must be one of {RNN_TYPES}, not {rnn_type!r}")
        self.rnn_type = rnn_type
        self.drop = nn.Dropout(dropout)
        self.embedding = nn.Embedding(vocab, emb)
        if rnn_type.startswith("RNN_"):
            self.rnn = nn.RNN(emb, hidden, layers, nonlinearity=rnn_type[4:].lower(), dropout=dropout)
        else:
            self.rnn = getattr(nn, rnn_type)(emb, hidden, layers, dropout=dropout)
        self.decoder = nn.Linear(hidden, vocab)

    def initial_state(self, batch: int, device):
        h = torch.zeros(self.rnn.num_layers, batch, self.rnn.hidden_size, device=device)
        return (h, h.clone()) if self.rnn_type == "LSTM" else h

    def forward(self, tokens, state):
        out, state = self.rnn(self.drop(self.embedding(tokens)), state)
        return self.decoder(self.drop(out)), state


def word_lm_sizes(cfg: Config):
    # The example's default sizes (200-wide embedding and hidden state, 2 layers,
    # 35 steps of batch 20) with 2000 words instead of WikiText-2's 33278.
    return cfg.pick(dict(vocab=2000, emb=200, hidden=200, layers=2, bptt=35, batch=20),
                    dict(vocab=50, emb=16, hidden=16, layers=2, bptt=5, batch=2))


def word_lm_train(cfg: Config, rnn_type: str = "LSTM"):
    s = word_lm_sizes(cfg)

    def build(device):
        torch.manual_seed(0)
        model = WordLM(rnn_type, s["vocab"], s["emb"], s["hidden"], s["layers"]).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=20.0)
        g = torch.Generator().manual_seed(1)
        stream = torch.randint(s["vocab"], (s["bptt"] + 1, s["batch"]), generator=g).to(device)
        x, y = stream[:-1], stream[1:]
        state = [model.initial_state(s["batch"], device)]

        def step():
            # The hidden state goes on from the previous step, detached, as the
            # example's training loop carries it.
            prev = state[0]
            prev = tuple(t.detach() for t in prev) if isinstance(prev, tuple) else prev.detach()
            logits, state[0] = model(x, prev)
            loss = F.cross_entropy(logits.view(-1, s["vocab"]), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            opt.step()
        return step
    return build


# -- workloads: build(device) -> step() --------------------------------------------

def gpt_sizes(cfg: Config):
    mc = gm.GPTConfig(vocab_size=64)   # the demo model: 4 layers, d_model 128, context 64
    tc = gm.TrainConfig(batch_size=32)
    if cfg.smoke:
        mc = gm.GPTConfig(vocab_size=64, n_layer=1, d_model=32, n_head=2, block_size=16)
        tc = gm.TrainConfig(batch_size=2)
    return mc, tc


def gpt_train(cfg: Config):
    mc, tc = gpt_sizes(cfg)

    def build(device):
        model = gm.GPT(mc, generator=torch.Generator().manual_seed(0)).to(device)
        opt = gm.make_optimizer(model, tc)
        g = torch.Generator().manual_seed(1)
        x = torch.randint(mc.vocab_size, (tc.batch_size, mc.block_size), generator=g).to(device)
        y = torch.randint(mc.vocab_size, (tc.batch_size, mc.block_size), generator=g).to(device)

        def step():
            _, loss = model(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip, foreach=True)
            opt.step()
        return step
    return build


def resnet_sizes(cfg: Config):
    # ImageNet-shaped ResNet-18 (11.7M parameters) on 112x112 images, batch 16.
    return cfg.pick(dict(batch=16, hw=112, width=64, classes=1000), dict(batch=2, hw=32, width=8, classes=10))


def resnet_train(cfg: Config):
    s = resnet_sizes(cfg)

    def build(device):
        torch.manual_seed(0)
        model = ResNet18(s["classes"], s["width"]).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, foreach=True)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(s["batch"], 3, s["hw"], s["hw"], generator=g).to(device)
        y = torch.randint(s["classes"], (s["batch"],), generator=g).to(device)

        def step():
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return step
    return build


def gpt_infer(cfg: Config, tokens: int):
    mc, _ = gpt_sizes(cfg)

    def build(device):
        model = gm.GPT(mc, generator=torch.Generator().manual_seed(0)).to(device).eval()
        ctx0 = torch.randint(mc.vocab_size, (1, mc.block_size), generator=torch.Generator().manual_seed(1))

        @torch.no_grad()
        def run():
            ctx = ctx0.to(device)
            for _ in range(tokens):
                logits, _ = model(ctx)
                nxt = logits[0, -1].argmax().item()     # the host needs the token: a sync
                ctx = torch.cat((ctx[:, 1:], torch.tensor([[nxt]], device=device)), dim=1)
        return run
    return build


WORD_LM_RNN_TYPE = "LSTM"   # the RESULTS row; word_lm_train takes any of RNN_TYPES
WORD_LM_WORKLOAD = f"{WORD_LM_RNN_TYPE.lower()}_lm_train_step"
WORKLOADS = ("gpt_train_step", "resnet18_train_step", WORD_LM_WORKLOAD, "gpt_infer_batch1_token")
STEPS = len(WORKLOADS)


def _repeat(build, k):
    def make(device):
        step = build(device)

        def run():
            for _ in range(k):
                step()
        return run
    return make


def run(cfg: Config, bar) -> dict:
    out = {}
    k = cfg.pick(5, 1)
    r = compare(_repeat(gpt_train(cfg), k), cfg, warmup=1, per=k)
    mc, tc = gpt_sizes(cfg)
    r["model"] = {"n_params": gm.count_parameters(gm.GPT(mc)), "batch": tc.batch_size, **vars(mc)}
    r.update(fused_in_one_step(gpt_train(cfg)(NEURON)))
    out["gpt_train_step"] = r
    bar.update(1)

    k = cfg.pick(2, 1)
    r = compare(_repeat(resnet_train(cfg), k), cfg, warmup=1, per=k, repeats=cfg.pick(5, 2))
    s = resnet_sizes(cfg)
    r["model"] = {"n_params": sum(p.numel() for p in ResNet18(s["classes"], s["width"]).parameters()), **s}
    r.update(fused_in_one_step(resnet_train(cfg)(NEURON)))
    out["resnet18_train_step"] = r
    bar.update(1)

    k = cfg.pick(5, 1)
    r = compare(_repeat(word_lm_train(cfg, WORD_LM_RNN_TYPE), k), cfg, warmup=1, per=k)
    s = word_lm_sizes(cfg)
    wl = WordLM(WORD_LM_RNN_TYPE, s["vocab"], s["emb"], s["hidden"], s["layers"])
    r["model"] = {"rnn_type": WORD_LM_RNN_TYPE, "n_params": sum(p.numel() for p in wl.parameters()), **s}
    r.update(fused_in_one_step(word_lm_train(cfg, WORD_LM_RNN_TYPE)(NEURON)))
    out[WORD_LM_WORKLOAD] = r
    bar.update(1)

    tokens = cfg.pick(32, 2)
    r = compare(gpt_infer(cfg, tokens), cfg, warmup=1, per=tokens)
    r["tokens_per_sample"] = tokens
    r.update(fused_in_one_step(gpt_infer(cfg, tokens)(NEURON)))  # per sample of `tokens` tokens
    out["gpt_infer_batch1_token"] = r
    bar.update(1)
    return out
