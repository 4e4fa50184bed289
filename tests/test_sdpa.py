"""Scaled dot-product attention on `neuron` chooses its kernel as the CPU does
(csrc/bridge/ops/attention.cpp): results and gradients bit for bit the CPU's,
and torch.nn.attention.sdpa_kernel is obeyed."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from neuron_testing import SEED

DEV = "neuron"


class OpsSeen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def attend_both(dtype, shape_q=(2, 4, 5, 8), shape_kv=(2, 4, 7, 8), mask=None, **kw):
    g = torch.Generator().manual_seed(SEED)
    q, k, v = (torch.randn(s, generator=g).to(dtype) for s in (shape_q, shape_kv, shape_kv))
    grad = torch.randn(shape_q[:-1] + shape_kv[-1:], generator=g).to(dtype)
    results = []
    for device in ("cpu", DEV):
        ins = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
        m = None if mask is None else mask.to(device)
        seen = OpsSeen()
        with seen:
            out = F.scaled_dot_product_attention(*ins, attn_mask=m, **kw)
        out.backward(grad.to(device))
        results.append(([out] + [t.grad for t in ins], seen.ops))
    return results


def assert_bitwise(results):
    (cpu, cpu_ops), (dev, dev_ops) = results
    assert cpu_ops == dev_ops, "the same kernels run"
    for name, a, b in zip(("output", "dq", "dk", "dv"), cpu, dev):
        assert b.device.type == DEV and a.stride() == b.stride(), name
        assert torch.equal(a, b.cpu()), f"{name}: {(a - b.cpu()).abs().max()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_fused_kernel_as_on_the_cpu(dtype):
    results = attend_both(dtype)
    assert "_scaled_dot_product_flash_attention_for_cpu" in results[0][1]
    assert_bitwise(results)


@pytest.mark.parametrize("case", ["causal", "bool mask", "float mask", "scale", "gqa"])
def test_masks_scales_and_grouped_heads(case):
    kw = {"causal": dict(is_causal=True, shape_kv=(2, 4, 5, 8)),
          "bool mask": dict(mask=torch.rand(5, 7, generator=torch.Generator().manual_seed(1)) > 0.3),
          "float mask": dict(mask=torch.randn(2, 1, 5, 7, generator=torch.Generator().manual_seed(2))),
          "scale": dict(scale=0.3),
          "gqa": dict(shape_kv=(2, 2, 7, 8), enable_gqa=True)}[case]
    assert_bitwise(attend_both(torch.float32, **kw))


@pytest.mark.parametrize("backend", [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION])
def test_sdpa_kernel_choice_is_obeyed(backend):
    with sdpa_kernel([backend]):
        results = attend_both(torch.float32)
    assert ("_scaled_dot_product_flash_attention_for_cpu" in results[1][1]) == (backend == SDPBackend.FLASH_ATTENTION)
    assert_bitwise(results)


def test_no_viable_backend_raises_as_on_the_cpu():
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        for device in ("cpu", DEV):
            q = torch.randn(1, 1, 2, 4, device=device)
            with pytest.raises(RuntimeError, match="No viable backend"):
                F.scaled_dot_product_attention(q, q, q)


def test_transformer_encoder_layer_trains_bitwise():
    torch.manual_seed(SEED)
    cpu = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    dev = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    dev.load_state_dict(cpu.state_dict())
    dev.to(DEV)
    x = torch.randn(3, 6, 16)
    for m, inp in ((cpu, x), (dev, x.to(DEV))):
        m(inp).square().mean().backward()
    for (name, p), (_, q) in zip(cpu.named_parameters(), dev.named_parameters()):
        assert torch.equal(p.grad, q.grad.cpu()), name


def test_self_attention_fast_path_in_eval_is_bitwise():
    """In eval, nn.MultiheadAttention and nn.TransformerEncoderLayer take PyTorch's fast path
    (_native_multi_head_attention, _transformer_encoder_layer_fwd), whose kernel projects q, k and v with
    one matrix product when they are the same tensor: one device tensor passed as three arguments must be
    one tensor to the kernel, on its first (synchronous) call and on later (queued) ones."""
    torch.manual_seed(SEED)
    layer = torch.nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0, batch_first=True, dtype=torch.float64).eval()
    mha = torch.nn.MultiheadAttention(4, 2, batch_first=True, dtype=torch.float64).eval()
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    for module in (layer, mha):
        dev = copy.deepcopy(module).to(DEV)
        with torch.no_grad():
            want = module(x) if module is layer else module(x, x, x, need_weights=False)[0]
            for _ in range(3):
                xd = x.to(DEV)
                got = dev(xd) if module is layer else dev(xd, xd, xd, need_weights=False)[0]
                assert torch.equal(got.cpu(), want), type(module).__name__


@pytest.mark.parametrize("name", ["nn.functional.scaled_dot_product_attention",
                                  "nn.functional.multi_head_attention_forward"])
def test_opinfo_samples_bitwise(name):
    """Every OpInfo sample of the two attention operators (dropout off),
    forward and backward, bit for bit the CPU's."""
    from torch.testing._internal.common_methods_invocations import op_db

    op = next(o for o in op_db if o.name == name)
    ran = 0
    for sample in op.sample_inputs("cpu", torch.float32, requires_grad=True):
        kwargs = dict(sample.kwargs)
        if "training" in kwargs:  # multi_head_attention_forward: dropout off
            kwargs["training"] = False
        if kwargs.get("dropout_p", 0):
            continue
        outs = []
        for device in ("cpu", DEV):
            def move(t):
                return t.detach().to(device).requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t
            inp, args = move(sample.input), [move(a) for a in sample.args]
            kw = {k: move(v) for k, v in kwargs.items()}
            out = op(inp, *args, **kw)
            out = out[0] if isinstance(out, tuple) else out
            leaves = [t for t in [inp, *args, *kw.values()] if isinstance(t, torch.Tensor) and t.requires_grad]
            grads = torch.autograd.grad(out.sum(), leaves, allow_unused=True)
            outs.append([out.detach().cpu()] + [g.cpu() if g is not None else None for g in grads])
        for a, b in zip(*outs):
            assert (a is None and b is None) or torch.equal(a, b), name
        ran += 1
    assert ran > 0
