"""torchvision on `neuron`: a classification model trains bit for bit the
CPU's; Faster R-CNN's preprocessing, backbone and RPN head compute the CPU's
bits; torchvision's device-type branches and PyPI's CUDA-only wheel, each a
`test_gap_*` that fails once torchvision changes (docs/ecosystem.md)."""
import copy
import inspect

import pytest
import torch

from .vision_testing import DEV, HAS_OPS, NO_OPS, TORCHVISION_INSTALLED, NO_TORCHVISION, assert_trains_bit_for_bit

if not TORCHVISION_INSTALLED:
    pytest.skip(NO_TORCHVISION, allow_module_level=True)
import torchvision  # noqa: E402
from torchvision.transforms.v2 import functional as F  # noqa: E402

GAP = "torchvision changed: update the gap in docs/ecosystem.md and this test"


def test_resnet18_infers_and_trains_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 32, 32, generator=gen)
    y = torch.randint(0, 4, (4,), generator=gen)

    def make():
        torch.manual_seed(0)
        return torchvision.models.resnet18(weights=None, num_classes=4)

    assert_trains_bit_for_bit(make, x, y, steps=3)


def tiny_faster_rcnn():
    torch.manual_seed(0)
    return torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3, min_size=64, max_size=96).eval()


def images():
    gen = torch.Generator().manual_seed(0)
    return [torch.rand(3, 64, 80, generator=gen), torch.rand(3, 72, 64, generator=gen)]


def test_faster_rcnn_features_and_rpn_head_bit_for_bit():
    """Everything before the first NMS: GeneralizedRCNNTransform (normalise,
    float resize, batching), the MobileNetV3-FPN backbone and the RPN head's
    objectness and box deltas, on the CPU's bits. Runs without torchvision's
    compiled operators."""
    model = tiny_faster_rcnn()
    dev_model = copy.deepcopy(model).to(DEV)
    with torch.no_grad():
        cpu_in, _ = model.transform(images())
        dev_in, _ = dev_model.transform([i.to(DEV) for i in images()])
        assert cpu_in.image_sizes == dev_in.image_sizes
        assert torch.equal(cpu_in.tensors, dev_in.tensors.cpu())
        cpu_feat, dev_feat = model.backbone(cpu_in.tensors), dev_model.backbone(dev_in.tensors)
        assert cpu_feat.keys() == dev_feat.keys()
        for k in cpu_feat:
            assert torch.equal(cpu_feat[k], dev_feat[k].cpu()), k
        cpu_head = model.rpn.head(list(cpu_feat.values()))
        dev_head = dev_model.rpn.head(list(dev_feat.values()))
        for a, b in zip(cpu_head, dev_head):
            for x, y in zip(a, b):
                assert torch.equal(x, y.cpu())


@pytest.mark.skipif(not HAS_OPS, reason=NO_OPS)
def test_faster_rcnn_detections_against_the_cpu():
    """The whole detector in eval mode. Not run where these notes were written
    (no CPU build of torchvision there); the RPN's batched_nms takes a
    different method on `neuron` (test_gap_batched_nms_picks_its_method_by_device_type),
    so the boxes may differ from the CPU's: this records what it gives."""
    model = tiny_faster_rcnn()
    with torch.no_grad():
        cpu = model(images())
        dev = copy.deepcopy(model).to(DEV)([i.to(DEV) for i in images()])
    for c, d in zip(cpu, dev):
        for k in ("boxes", "labels", "scores"):
            assert torch.equal(c[k], d[k].cpu()), k


def test_gap_batched_nms_picks_its_method_by_device_type():
    """torchvision/ops/boxes.py, batched_nms: the per-class loop
    (_batched_nms_vanilla) for more than 4000 coordinates on the CPU, but only
    above 100000 elsewhere; below, the coordinate trick (every box shifted by
    class x (max coordinate + 1), one NMS), whose float32 shifts change IoUs
    near the threshold, so a different set of boxes survives. Faster R-CNN's
    RPN calls it on up to 1000 boxes per FPN level at once, so on `neuron` the
    proposals, and the detections, can differ from the CPU's."""
    src = inspect.getsource(torchvision.ops.boxes.batched_nms)
    assert '4000 if boxes.device.type == "cpu" else 100_000' in src, GAP


def test_uint8_resize_on_cpu_before_the_move_is_the_cpus():
    """Workaround for the gap below: resize uint8 images on the CPU (where a
    DataLoader's transforms run anyway), or convert them to float first; both
    give the CPU's bits."""
    img = torch.randint(0, 256, (3, 40, 40), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    cpu = F.resize(img, [24, 24])
    assert torch.equal(F.resize(img, [24, 24]).to(DEV).cpu(), cpu)
    f = F.to_dtype(img, torch.float32, scale=True)
    assert torch.equal(F.resize(f, [24, 24]), F.resize(f.to(DEV), [24, 24]).cpu())


def test_gap_uint8_resize_picks_its_kernel_by_device_type():
    """transforms.v2.functional.resize_image: a bilinear uint8 image is resized
    by ATen's native uint8 kernel only when `image.device.type == "cpu"`;
    elsewhere it is cast to float32, interpolated and rounded back, so pixels
    differ by 1 from the CPU's."""
    img = torch.randint(0, 256, (3, 40, 40), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    cpu = F.resize(img, [24, 24])
    dev = F.resize(img.to(DEV), [24, 24]).cpu()
    assert dev.dtype == torch.uint8
    diff = (cpu.int() - dev.int()).abs()
    assert diff.max() == 1, GAP
    src = inspect.getsource(torchvision.transforms.v2.functional._geometry.resize_image)
    assert 'elif image.device.type == "cpu":' in src, GAP


def test_gap_pypi_wheel_is_built_for_cuda():
    """PyPI's torchvision wheel links libtorch_cuda.so: with the CPU build of
    torch its compiled operators do not load and `import torchvision` fails
    (vision_testing.py). The CPU build of torchvision loads them."""
    cuda_build = "+cu" in torchvision.__version__     # PyPI's: "0.28.0+cu130"; the CPU build's: "+cpu"
    if HAS_OPS:
        assert not cuda_build, GAP + " (PyPI's CUDA wheel now loads on the CPU build of torch)"
        pytest.skip("torchvision's CPU build is installed: its operators load")
    assert cuda_build, torchvision.__version__
    assert not torchvision.extension._has_ops()
    with pytest.raises(RuntimeError, match="Couldn't load custom C"):
        torchvision.ops.nms(torch.zeros(1, 4), torch.ones(1), 0.5)
