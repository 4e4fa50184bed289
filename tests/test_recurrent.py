"""Recurrent layers (nn.RNN, nn.LSTM, nn.GRU and their cells) on `neuron`
against the CPU: outputs, final hidden states, their strides, and gradients of
inputs, initial states and every parameter, bit for bit.

Every operator of the recurrent code, float32 tanh included, is the CPU's
kernel on both sides (docs/numerics.md). A float32 LSTM runs oneDNN's layer on
both.
"""
import copy
import itertools

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import torchneuron
from neuron_testing import SEED, FusableFrom

DEV = "neuron"


def assert_same(cpu, dev, what):
    assert dev.device.type == DEV, what
    assert cpu.shape == dev.shape and cpu.dtype == dev.dtype, what
    assert cpu.stride() == dev.stride(), f"{what}: strides {cpu.stride()} on the CPU, {dev.stride()} on {DEV}"
    assert torch.equal(cpu, dev.cpu()), f"{what}: max difference {(cpu - dev.cpu()).abs().max().item()}"


def to_dev(h):
    return tuple(t.to(DEV) for t in h) if isinstance(h, tuple) else h.to(DEV)


def leaves(h):
    return tuple(t.requires_grad_() for t in h) if isinstance(h, tuple) else h.requires_grad_()


def flat(h):
    return h if isinstance(h, tuple) else (h,)


def run_both(make_module, make_inputs, forward, dtype, train=True):
    """Builds the module and inputs on the CPU, a copy on `neuron`, runs
    `forward(module, *inputs)` (a tuple of tensors) on both, and backward of
    sum(w_i * out_i); returns the pairs to compare."""
    torch.manual_seed(SEED)
    cpu_module = make_module().to(dtype).train(train)
    dev_module = copy.deepcopy(cpu_module).to(DEV)
    cpu_inputs = make_inputs(dtype)
    dev_inputs = [to_dev(t) for t in cpu_inputs]
    cpu_inputs = [leaves(t) for t in cpu_inputs]
    dev_inputs = [leaves(t) for t in dev_inputs]
    cpu_out = forward(cpu_module, *cpu_inputs)
    dev_out = forward(dev_module, *dev_inputs)
    weights = [torch.randn(o.shape, dtype=o.dtype) for o in cpu_out]
    sum((o * w).sum() for o, w in zip(cpu_out, weights)).backward()
    sum((o * w.to(DEV)).sum() for o, w in zip(dev_out, weights)).backward()
    pairs = [(f"output {i}", c, d) for i, (c, d) in enumerate(zip(cpu_out, dev_out))]
    for i, (c, d) in enumerate(zip(cpu_inputs, dev_inputs)):
        pairs += [(f"grad of input {i}.{k}", a.grad, b.grad) for k, (a, b) in enumerate(zip(flat(c), flat(d)))]
    for (name, p), (_, q) in zip(cpu_module.named_parameters(), dev_module.named_parameters()):
        pairs.append((f"grad of {name}", p.grad, q.grad))
    return pairs


def check(pairs):
    for what, c, d in pairs:
        assert_same(c, d, what)


T, B, I, H = 4, 3, 5, 6
LENGTHS = torch.tensor([4, 2, 3])
KINDS = {"RNN_TANH": (torch.nn.RNN, {"nonlinearity": "tanh"}), "RNN_RELU": (torch.nn.RNN, {"nonlinearity": "relu"}),
         "LSTM": (torch.nn.LSTM, {}), "GRU": (torch.nn.GRU, {})}
LAYOUTS = [dict(num_layers=layers, bidirectional=bidir, bias=bias, batch_first=batch_first)
           for layers, bidir, bias, batch_first in itertools.product([1, 2], [False, True], [True, False], [False, True])]


def layer_case(kind, layout, packed, proj, dtype):
    cls, extra = KINDS[kind]
    kw = {**layout, **extra, **({"proj_size": proj} if proj else {})}
    directions = 2 if layout["bidirectional"] else 1
    states = layout["num_layers"] * directions

    def make_inputs(dt):
        x = torch.randn((B, T, I) if layout["batch_first"] else (T, B, I), dtype=dt)
        h = torch.randn(states, B, proj or H, dtype=dt)
        return [x, (h, torch.randn(states, B, H, dtype=dt)) if kind == "LSTM" else h]

    def forward(m, x, h):
        if packed:
            out, hidden = m(pack_padded_sequence(x, LENGTHS, batch_first=m.batch_first, enforce_sorted=False), h)
            out = pad_packed_sequence(out, batch_first=m.batch_first)[0]
        else:
            out, hidden = m(x, h)
        return (out, *flat(hidden))

    return run_both(lambda: cls(I, H, **kw), make_inputs, forward, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("kind", KINDS)
def test_layers_bitwise(kind, packed, dtype):
    """Every layout of stacked, bidirectional, bias-free and batch-first layers, padded and packed."""
    for layout in LAYOUTS:
        check(layer_case(kind, layout, packed, 0, dtype))


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_lstm_with_projections_bitwise(packed):
    for layout in LAYOUTS[::3]:
        check(layer_case("LSTM", layout, packed, 3, torch.float32))


def test_bfloat16_lstm_and_gru_bitwise():
    for kind in ("LSTM", "GRU"):
        check(layer_case(kind, LAYOUTS[5], False, 0, torch.bfloat16))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("cell", [torch.nn.LSTMCell, torch.nn.GRUCell, torch.nn.RNNCell])
def test_cells_bitwise(cell, bias):
    for shape in [(B, I), (I,)]:  # batched and unbatched
        def make_inputs(dt):
            hshape = shape[:-1] + (H,)
            h = torch.randn(hshape, dtype=dt)
            return [torch.randn(shape, dtype=dt), (h, torch.randn(hshape, dtype=dt)) if cell is torch.nn.LSTMCell else h]

        check(run_both(lambda: cell(I, H, bias=bias), make_inputs, lambda m, x, h: flat(m(x, h)), torch.float32))


def test_without_initial_state_and_in_inference_mode():
    torch.manual_seed(SEED)
    for cls in (torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN):
        m = cls(I, H, num_layers=2)
        n = copy.deepcopy(m).to(DEV)
        x = torch.randn(T, B, I)
        with torch.inference_mode():
            expected = m(x)
        with torch.inference_mode():
            got = n(x.to(DEV))
        for c, d in zip(flat(expected[0]) + flat(expected[1]), flat(got[0]) + flat(got[1])):
            assert_same(c, d, cls.__name__)


def test_dropout_between_layers_draws_from_the_device_generator():
    m = torch.nn.LSTM(I, H, num_layers=3, dropout=0.5).to(DEV)
    x = torch.randn(T, B, I, device=DEV)
    torch.manual_seed(1)
    a = m(x)[0]
    torch.manual_seed(1)
    b = m(x)[0]
    c = m(x)[0]
    assert torch.equal(a.cpu(), b.cpu()) and not torch.equal(b.cpu(), c.cpu())
    m.eval()
    assert torch.equal(m(x)[0].cpu(), m(x)[0].cpu())


def test_errors_as_on_the_cpu():
    """Bad shapes raise the CPU's exception type, at the call."""
    cases = [
        (lambda d: torch.nn.LSTM(I, H).to(d), lambda d: (torch.randn(T, B, I + 1, device=d),)),
        (lambda d: torch.nn.GRU(I, H).to(d), lambda d: (torch.randn(T, B, I, device=d), torch.randn(2, B, H, device=d))),
        (lambda d: torch.nn.LSTM(I, H).to(d),
         lambda d: (torch.randn(T, B, I, device=d), (torch.randn(1, B, H, device=d), torch.randn(1, B + 1, H, device=d)))),
        (lambda d: torch.nn.LSTMCell(I, H).to(d), lambda d: (torch.randn(B, I, device=d), (torch.randn(B + 1, H, device=d),) * 2)),
        (lambda d: torch.nn.RNN(I, H).to(d), lambda d: (torch.randn(0, B, I, device=d),)),
    ]
    for make, args in cases:
        with pytest.raises(Exception) as on_cpu:
            make("cpu")(*args("cpu"))
        with pytest.raises(Exception) as on_dev:
            make(DEV)(*args(DEV))
        assert type(on_dev.value) is type(on_cpu.value), (on_cpu.value, on_dev.value)
    # packed input whose batch sizes live on the device: named, not read as host memory
    with pytest.raises(RuntimeError, match="batch_sizes"):
        torch.lstm(torch.randn(5, I, device=DEV), torch.tensor([3, 2], device=DEV),
                   [torch.zeros(1, 3, H, device=DEV)] * 2, list(torch.nn.LSTM(I, H).to(DEV)._flat_weights),
                   True, 1, 0.0, False, False)


def test_autocast_runs_in_lower_precision():
    m = torch.nn.LSTM(I, H).to(DEV)
    with torch.autocast(DEV, dtype=torch.bfloat16):
        out, (h, c) = m(torch.randn(T, B, I, device=DEV))
    out.float().sum().backward()
    assert m.weight_ih_l0.grad is not None and m.weight_ih_l0.grad.dtype == torch.float32


# --- real programs: word-level language models as in pytorch/examples' word_language_model

PROJ = 8  # LSTM_PROJ's projection size


class LanguageModel(torch.nn.Module):
    def __init__(self, kind, vocab=50, width=16, layers=2):
        super().__init__()
        cls, extra = KINDS["LSTM" if kind == "LSTM_PROJ" else kind]
        extra = {**extra, "proj_size": PROJ} if kind == "LSTM_PROJ" else extra
        self.encoder = torch.nn.Embedding(vocab, width)
        self.rnn = cls(width, width, layers, **extra)
        self.decoder = torch.nn.Linear(PROJ if kind == "LSTM_PROJ" else width, vocab)

    def forward(self, tokens, hidden):
        out, hidden = self.rnn(self.encoder(tokens), hidden)
        return self.decoder(out), hidden


def gelu_new(x):
    """GPT-2's activation as Hugging Face writes it (gelu_new): torch.tanh itself."""
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


class GptMlpModel(torch.nn.Module):
    """GPT-2's MLP block over token embeddings: tanh-GELU as F.gelu(approximate="tanh")
    and as gelu_new, residual and layer norm."""

    def __init__(self, vocab=50, width=256):
        super().__init__()
        self.encoder = torch.nn.Embedding(vocab, width)
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)
        self.up2, self.down2 = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)
        self.norm = torch.nn.LayerNorm(width)
        self.decoder = torch.nn.Linear(width, vocab)

    def forward(self, tokens, hidden):
        x = self.encoder(tokens)
        x = x + self.down(torch.nn.functional.gelu(self.up(x), approximate="tanh"))
        x = x + self.down2(gelu_new(self.up2(self.norm(x))))
        return self.decoder(x), hidden


def detach(h):
    return tuple(t.detach() for t in h) if isinstance(h, tuple) else h.detach()


def train_language_model(kind, device, steps=8, bptt=8, batch=4, vocab=50):
    torch.manual_seed(SEED)
    model = (GptMlpModel(vocab) if kind == "GPT2_MLP" else LanguageModel(kind, vocab)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=2.0)
    # a learnable text: each column counts up from a random start, now and then skipping a word
    g = torch.Generator().manual_seed(SEED)
    jumps = 1 + (torch.rand(steps * bptt + 1, batch, generator=g) < 0.1).long()
    text = (torch.randint(0, vocab, (1, batch), generator=g) + jumps.cumsum(0)) % vocab
    zeros = torch.zeros(2, batch, 16, device=device)
    hidden = {"LSTM": (zeros, zeros), "LSTM_PROJ": (zeros[..., :PROJ], zeros)}.get(kind, zeros)
    losses = []
    for s in range(steps):
        x = text[s * bptt:(s + 1) * bptt].to(device)
        y = text[s * bptt + 1:(s + 1) * bptt + 1].to(device)
        hidden = detach(hidden)
        logits, hidden = model(x, hidden)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab), y.view(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        opt.step()
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN_TANH", "LSTM_PROJ", "GPT2_MLP"])
def test_language_model_training_bitwise(kind):
    """Training on `neuron` equals training on the CPU bit for bit, float32
    tanh included (the CPU's on both sides: nothing is patched), with fusion
    taking the GPT-2 block's element-wise work, its tanh among it."""
    cpu_losses, cpu_model = train_language_model(kind, "cpu")
    torchneuron.clear_op_tracking()
    with FusableFrom(1 << 15):
        dev_losses, dev_model = train_language_model(kind, DEV)
    if kind == "GPT2_MLP":
        assert torchneuron.get_fused_ops().get("aten::tanh", 0) > 0, "fusion took no tanh"
    assert dev_losses == cpu_losses
    assert cpu_losses[-1] < cpu_losses[0]
    for (name, p), (_, q) in zip(cpu_model.named_parameters(), dev_model.named_parameters()):
        assert torch.equal(p, q.cpu()), name
