"""FlexAttention and varlen attention on neuron, against the CPU (docs/flex_attention.md).

Eager flex is a math implementation over ordinary operators: neuron runs the CPU's
kernels, so results and gradients are bitwise the CPU's. Compiled inference uses the
CPU's C++ flex template (patch inductor-flex-cpu-template): bitwise compiled CPU
Inductor's. Compiled training and compiled return_lse use the dense decomposition
(patch inductor-flex-dense), which has no CPU counterpart (PyTorch refuses flex
training on the CPU); they are compared with eager within FLEX_COMPILED_TOL.
"""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import flex_attention as fa
from torch.nn.attention.varlen import AuxRequest, varlen_attn

import torchneuron

# Compiled training and return_lse against eager: Inductor fuses the dense decomposition's
# softmax and reductions into C++ loops that associate sums differently from ATen's kernels,
# so results agree to float32 rounding over a row of scores, not bitwise.
FLEX_COMPILED_TOL = dict(rtol=1e-5, atol=1e-5)

B, H, L, D = 2, 4, 128, 16

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile",
                                        "ignore:return_lse is deprecated")


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= 40)


_DOCUMENT = torch.tensor([0] * 50 + [1] * 30 + [2] * 48)  # three packed documents in L = 128


def document(b, h, q_idx, kv_idx):
    return (_DOCUMENT_ON[q_idx] == _DOCUMENT_ON[kv_idx]) & (q_idx >= kv_idx)


_DOCUMENT_ON = _DOCUMENT  # the mask reads the ids on the device the block mask is built on


def relative_bias(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx) * 0.05


def alibi(score, b, h, q_idx, kv_idx):
    return score - torch.exp2(-(h + 1.0)) * (q_idx - kv_idx)


def softcap(score, b, h, q_idx, kv_idx):
    return 20.0 * torch.tanh(score / 20.0)


MASKS = {"causal": causal, "sliding_window": sliding_window, "document": document}
SCORE_MODS = {"none": None, "relative_bias": relative_bias, "alibi": alibi, "softcap": softcap}


def _block_mask(mask_mod, device, lq=L, lk=L):
    global _DOCUMENT_ON
    _DOCUMENT_ON = _DOCUMENT.to(device)
    return fa.create_block_mask(mask_mod, None, None, lq, lk, device=device)


def _qkv(hkv=H, requires_grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g)
    k, v = (torch.randn(B, hkv, L, D, generator=g) for _ in range(2))
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def _on(tensors, device, requires_grad=False):
    return [t.detach().to(device).requires_grad_(requires_grad) for t in tensors]


@pytest.fixture
def cpu_flex_backward(monkeypatch):
    """PyTorch refuses flex's backward on the CPU by a device check alone (the math under it is
    device-agnostic): lifted here so that the CPU can be the gradients' reference."""
    monkeypatch.setattr(fa, "_validate_device", lambda q, k, v: None)


def _assert_bitwise(neuron, cpu):
    assert neuron.device.type == "neuron"
    assert torch.equal(neuron.cpu(), cpu), (neuron.cpu() - cpu).abs().max()


# ----------------------------------------------------------------------------- eager

@pytest.mark.parametrize("mask", sorted(MASKS))
def test_block_mask_built_on_neuron_equals_the_cpus(mask):
    bn, bc = _block_mask(MASKS[mask], "neuron"), _block_mask(MASKS[mask], "cpu")
    assert bn.kv_num_blocks.device.type == "neuron"
    for tn, tc in zip(bn.as_tuple()[:-1], bc.as_tuple()[:-1]):
        if isinstance(tn, torch.Tensor):
            assert torch.equal(tn.cpu(), tc)
        else:
            assert tn == tc


@pytest.mark.parametrize("mask,score_mod,gqa", [
    ("causal", "none", False), ("sliding_window", "relative_bias", False),
    ("document", "alibi", True), ("causal", "softcap", True)])
def test_eager_matches_cpu_bitwise(mask, score_mod, gqa):
    hkv = 2 if gqa else H
    qkv = _qkv(hkv)
    kwargs = dict(score_mod=SCORE_MODS[score_mod], enable_gqa=gqa)
    out_c = fa.flex_attention(*qkv, block_mask=_block_mask(MASKS[mask], "cpu"), **kwargs)
    torchneuron.clear_op_tracking()  # the fallbacks of earlier tests are not this one's
    out_n = fa.flex_attention(*_on(qkv, "neuron"), block_mask=_block_mask(MASKS[mask], "neuron"), **kwargs)
    _assert_bitwise(out_n, out_c)
    assert torchneuron.get_fallback_ops() == {}


def test_eager_return_lse_matches_cpu_bitwise():
    qkv = _qkv()
    out_c, lse_c = fa.flex_attention(*qkv, block_mask=_block_mask(causal, "cpu"), return_lse=True)
    out_n, lse_n = fa.flex_attention(*_on(qkv, "neuron"), block_mask=_block_mask(causal, "neuron"),
                                     return_lse=True)
    _assert_bitwise(out_n, out_c)
    _assert_bitwise(lse_n, lse_c)


@pytest.mark.parametrize("score_mod,gqa", [("relative_bias", False), ("softcap", True)])
def test_eager_gradients_match_cpu_bitwise(cpu_flex_backward, score_mod, gqa):
    qkv_c = _qkv(2 if gqa else H, requires_grad=True)
    qkv_n = _on(qkv_c, "neuron", requires_grad=True)
    kwargs = dict(score_mod=SCORE_MODS[score_mod], enable_gqa=gqa)
    out_c = fa.flex_attention(*qkv_c, block_mask=_block_mask(sliding_window, "cpu"), **kwargs)
    out_n = fa.flex_attention(*qkv_n, block_mask=_block_mask(sliding_window, "neuron"), **kwargs)
    grad = torch.randn_like(out_c)
    out_c.backward(grad)
    out_n.backward(grad.to("neuron"))
    _assert_bitwise(out_n.detach(), out_c.detach())
    for tn, tc in zip(qkv_n, qkv_c):
        _assert_bitwise(tn.grad, tc.grad)


def test_stock_cpu_still_refuses_flex_backward():
    # upstream notice: when PyTorch trains flex on the CPU, the fixture above can go
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        fa.flex_attention(*_qkv(requires_grad=True))


# ----------------------------------------------------------------------------- errors

def _error(fn):
    with pytest.raises(Exception) as info:
        fn()
    return type(info.value), str(info.value)


@pytest.mark.parametrize("case", ["embed_dim", "gqa_heads", "gqa_off", "batch", "mask_too_small", "rank"])
def test_bad_input_gives_the_cpus_exception(case):
    def inputs(device):
        q, k, v = _qkv()
        if case == "embed_dim":
            k = torch.randn(B, H, L, D + 1)
        elif case in ("gqa_heads", "gqa_off"):
            k, v = torch.randn(B, 3, L, D), torch.randn(B, 3, L, D)
        elif case == "batch":
            k, v = torch.randn(B + 1, H, L, D), torch.randn(B + 1, H, L, D)
        elif case == "rank":
            q, k, v = q[0], k[0], v[0]
        kwargs = {"enable_gqa": case == "gqa_heads"}
        if case == "mask_too_small":
            kwargs["block_mask"] = _block_mask(causal, device, L // 2, L // 2)
        return [t.to(device) for t in (q, k, v)], kwargs

    def call(device):
        args, kwargs = inputs(device)
        return lambda: fa.flex_attention(*args, **kwargs)

    kind_c, message_c = _error(call("cpu"))
    kind_n, message_n = _error(call("neuron"))
    assert kind_n is kind_c
    assert message_n == message_c.replace("cpu", "neuron")


def test_block_mask_on_another_device_is_refused():
    with pytest.raises(RuntimeError, match="Expect q/k/v and block_mask to be on the same device"):
        fa.flex_attention(*_on(_qkv(), "neuron"), block_mask=_block_mask(causal, "cpu"))


def test_stock_pytorch_still_refuses_neuron():
    # upstream notice: when PyTorch accepts other devices, patch flex-device can go
    q = torch.empty(1, 1, 1, 1, device="neuron")
    with pytest.raises(ValueError, match="FlexAttention is only supported on CUDA, CPU"):
        fa._validate_device._torchneuron_original(q, q, q)


# ----------------------------------------------------------------------------- compiled

def _compiled_ops():
    return [name for name in torchneuron.get_executed_ops() if name.startswith("compiled::")]


@pytest.mark.parametrize("backend", ["neuron", "inductor"])
def test_compiled_inference_matches_compiled_cpu_bitwise(backend):
    qkv = _qkv(2)
    kwargs = dict(score_mod=relative_bias, enable_gqa=True)
    with torch.no_grad():
        out_c = torch.compile(fa.flex_attention, backend="inductor")(
            *qkv, block_mask=_block_mask(causal, "cpu"), **kwargs)
    torchneuron.clear_op_tracking()
    flex = torch.compile(fa.flex_attention, backend=backend)
    block_mask = _block_mask(causal, "neuron")
    with torch.no_grad():
        out_n = flex(*_on(qkv, "neuron"), block_mask=block_mask, **kwargs)
    _assert_bitwise(out_n, out_c)
    assert any("flex_attention" in name for name in _compiled_ops()), _compiled_ops()
    # grad enabled, nothing requires it: flex asks for the logsumexp, the graph does not read it, and
    # the C++ template still serves it
    out_g = flex(*_on(qkv, "neuron"), block_mask=block_mask, **kwargs)
    _assert_bitwise(out_g, out_c)


def test_compiled_training_matches_eager():
    qkv = _qkv(2)
    block_mask = _block_mask(document, "neuron")
    kwargs = dict(score_mod=alibi, block_mask=block_mask, enable_gqa=True)
    grad = torch.randn(B, H, L, D).to("neuron")
    results = []
    for flex in (fa.flex_attention, torch.compile(fa.flex_attention, backend="neuron")):
        torchneuron.clear_op_tracking()
        qkv_n = _on(qkv, "neuron", requires_grad=True)
        out = flex(*qkv_n, **kwargs)
        out.backward(grad)
        results.append([out.detach().cpu()] + [t.grad.cpu() for t in qkv_n])
    assert any("flex_attention_backward" in name for name in _compiled_ops()), _compiled_ops()
    for compiled, eager in zip(results[1], results[0]):
        torch.testing.assert_close(compiled, eager, **FLEX_COMPILED_TOL)


def test_compiled_return_lse_matches_eager():
    qkv = _on(_qkv(), "neuron")
    block_mask = _block_mask(sliding_window, "neuron")
    with torch.no_grad():
        out_c, lse_c = torch.compile(fa.flex_attention, backend="neuron")(*qkv, block_mask=block_mask,
                                                                            return_lse=True)
        out_e, lse_e = fa.flex_attention(*qkv, block_mask=block_mask, return_lse=True)
    torch.testing.assert_close(out_c.cpu(), out_e.cpu(), **FLEX_COMPILED_TOL)
    torch.testing.assert_close(lse_c.cpu(), lse_e.cpu(), **FLEX_COMPILED_TOL)


# ----------------------------------------------------------------------------- varlen

LENGTHS = [5, 17, 1, 9]


def _packed(hq=4, hkv=2, d=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    t = sum(LENGTHS)
    q = torch.randn(t, hq, d, generator=g)
    k, v = (torch.randn(t, hkv, d, generator=g) for _ in range(2))
    cu = torch.tensor([0] + torch.tensor(LENGTHS).cumsum(0).tolist(), dtype=torch.int32)
    return q, k, v, cu


def _varlen_reference(q, k, v, cu, window=(-1, -1)):
    """Per-sequence scaled_dot_product_attention on the CPU, each key/value head repeated for its group."""
    groups = q.size(1) // k.size(1)
    outs = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qs, ks, vs = (t[a:b].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        ks, vs = (t.repeat_interleave(groups, dim=1) for t in (ks, vs))
        left, right = window
        if (left, right) == (-1, 0):
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
        elif (left, right) == (-1, -1):
            o = F.scaled_dot_product_attention(qs, ks, vs)
        else:
            i = torch.arange(b - a)
            allowed = (i[None, :] <= i[:, None] + right) & (i[None, :] >= i[:, None] - left)
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=allowed)
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0)])
def test_varlen_matches_per_sequence_sdpa_bitwise(window):
    q, k, v, cu = _packed()
    qkv_c = [t.clone().requires_grad_() for t in (q, k, v)]
    qkv_n = _on((q, k, v), "neuron", requires_grad=True)
    cu_n = cu.to("neuron")
    out_n = varlen_attn(*qkv_n, cu_n, cu_n, max(LENGTHS), max(LENGTHS), window_size=window, enable_gqa=True)
    out_c = _varlen_reference(*qkv_c, cu, window)
    grad = torch.randn_like(out_c)
    out_n.backward(grad.to("neuron"))
    out_c.backward(grad)
    _assert_bitwise(out_n.detach(), out_c.detach())
    for tn, tc in zip(qkv_n, qkv_c):
        _assert_bitwise(tn.grad, tc.grad)


def test_varlen_sliding_window_and_lse():
    q, k, v, cu = _packed(hq=2, hkv=2)
    cu_n = cu.to("neuron")
    out, lse = varlen_attn(*_on((q, k, v), "neuron"), cu_n, cu_n, max(LENGTHS), max(LENGTHS),
                           window_size=(3, 0), return_aux=AuxRequest(lse=True))
    torch.testing.assert_close(out.cpu(), _varlen_reference(q, k, v, cu, (3, 0)))
    assert lse.shape == (2, sum(LENGTHS)) and lse.dtype == torch.float32
    a, b = cu[1].item(), cu[2].item()  # the second sequence: lse of its masked, scaled scores
    scores = q[a:b].transpose(0, 1) @ k[a:b].permute(1, 2, 0) / q.size(-1) ** 0.5
    i = torch.arange(b - a)
    scores = scores.masked_fill(~((i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - 3)), float("-inf"))
    torch.testing.assert_close(lse.cpu()[:, a:b], scores.logsumexp(-1))


def test_varlen_out_variant():
    from torch.nn.attention.varlen import varlen_attn_out

    q, k, v, cu = _packed()
    cu_n = cu.to("neuron")
    out = torch.empty(q.shape, device="neuron")
    varlen_attn_out(out, *_on((q, k, v), "neuron"), cu_n, cu_n, max(LENGTHS), max(LENGTHS), enable_gqa=True)
    _assert_bitwise(out, _varlen_reference(q, k, v, cu))


def test_varlen_bad_input():
    q, k, v, cu = _packed()
    qkv = _on((q, k, v), "neuron")
    bad = torch.tensor([0, 5, 3, 30], dtype=torch.int32, device="neuron")
    with pytest.raises(ValueError, match="cu_seq_q must start at 0, not decrease"):
        varlen_attn(*qkv, bad, bad, 17, 17, enable_gqa=True)
    with pytest.raises(ValueError, match="same number of sequences"):
        varlen_attn(*qkv, cu.to("neuron"), cu[:-1].to("neuron"), 17, 17, enable_gqa=True)
    # the heads check is varlen_attn's own, before any kernel: the CPU's message
    kind_c, message_c = _error(lambda: varlen_attn(q, k, v, cu, cu, 17, 17))
    kind_n, message_n = _error(lambda: varlen_attn(*qkv, cu.to("neuron"), cu.to("neuron"), 17, 17))
    assert (kind_n, message_n) == (kind_c, message_c)


def test_stock_varlen_still_has_no_cpu_kernel():
    # upstream notice: when PyTorch gives varlen a CPU path, route neuron to it (torchneuron/varlen.py)
    q, k, v, cu = _packed(hq=2)
    with warnings.catch_warnings(), pytest.raises(NotImplementedError, match="_flash_attention_forward"):
        varlen_attn(q, k, v, cu, cu, 17, 17, enable_gqa=True)
