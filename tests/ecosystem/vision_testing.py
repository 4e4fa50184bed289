"""Shared by test_timm.py and test_torchvision.py: importing torchvision (and
so timm, which imports it) with the wheel PyPI has, and a differential
training loop.

PyPI's torchvision 0.28.0 wheel is built for CUDA: its compiled operators
(`torchvision/_C.so`) link libtorch_cuda.so and libc10_cuda.so, which the CPU
build of torch (the one this project uses) does not have. torchvision then
fails at import, registering a fake kernel for `torchvision::nms`, an operator
that never got defined ("operator torchvision::nms does not exist"), and so
does every library that imports it (timm, and transformers' model classes).
With the CPU build of torchvision (from PyTorch's CPU wheel index) the
operators load and nothing here is needed. With the CUDA wheel,
`ensure_torchvision_importable` defines the two operators' schemas that
torchvision's import needs, so its Python parts (models, transforms) and timm
import; the compiled operators themselves (nms, roi_align's kernel) stay
missing, and `HAS_OPS` says so (docs/ecosystem.md)."""
import copy
import importlib.util
import os

import pytest
import torch

import torchneuron  # noqa: F401

DEV = "neuron"


def _load_torchvision_ops():
    spec = importlib.util.find_spec("torchvision")
    if spec is None:
        return None
    try:
        torch.ops.load_library(os.path.join(os.path.dirname(spec.origin), "_C.so"))
        return True
    except OSError:
        return False


_OPS = _load_torchvision_ops()
if _OPS is False and not hasattr(torch.ops.torchvision, "nms"):
    _LIB = torch.library.Library("torchvision", "DEF")   # kept alive: the definitions last while it does
    _LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")

TORCHVISION_INSTALLED = _OPS is not None
HAS_OPS = bool(_OPS)
NO_TORCHVISION = ("torchvision is not installed: PyPI's wheel is built for CUDA and is not in "
                  "requirements.txt (docs/ecosystem.md); install its CPU build to run these tests")
NO_OPS = ("torchvision's compiled operators did not load (PyPI's CUDA wheel on the CPU build of torch, "
          "docs/ecosystem.md): install torchvision's CPU build to run this test")


def train(model, x, y, device, steps=3, lr=0.05):
    """`steps` SGD steps (momentum, weight decay) of cross-entropy on `device`:
    the losses, the eval-mode logits after training, and the final state."""
    model = model.to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    x, y = x.to(device), y.to(device)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu())
    model.eval()
    with torch.no_grad():
        logits = model(x).cpu()
    return losses, logits, {k: v.detach().cpu() for k, v in model.state_dict().items()}


def assert_trains_bit_for_bit(make_model, x, y, steps=3, lr=0.05):
    """Eval outputs of the fresh model, then `steps` training steps: losses,
    every parameter and buffer (batch norm's running statistics), and the eval
    outputs after training, all torch.equal to the CPU's."""
    model = make_model()
    with torch.no_grad():
        ref = copy.deepcopy(model).eval()
        assert torch.equal(ref(x), ref.to(DEV)(x.to(DEV)).cpu())
    cpu = train(copy.deepcopy(model), x, y, "cpu", steps, lr)
    dev = train(model, x, y, DEV, steps, lr)
    for i, (a, b) in enumerate(zip(cpu[0], dev[0])):
        assert torch.equal(a, b), f"loss of step {i}: {a.item()!r} on the CPU, {b.item()!r} on neuron"
    assert torch.isfinite(torch.stack(cpu[0])).all() and not torch.equal(cpu[0][0], cpu[0][-1])
    assert torch.isfinite(cpu[1]).all(), "pick a smaller learning rate: the CPU's run diverged"
    assert torch.equal(cpu[1], dev[1])
    assert cpu[2].keys() == dev[2].keys()
    for k in cpu[2]:
        assert torch.equal(cpu[2][k], dev[2][k]), k


def require_torchvision():
    if not TORCHVISION_INSTALLED:
        pytest.skip(NO_TORCHVISION)
