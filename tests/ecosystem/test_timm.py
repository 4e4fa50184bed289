"""timm on `neuron`: ResNet, ViT, ConvNeXt and EfficientNet (small configs,
random initialisation, 32x32 images, 4 classes) infer and train (SGD) bit for
bit the CPU's. timm imports torchvision: see vision_testing.py for PyPI's
wheel."""
import pytest
import torch

from .vision_testing import NO_TORCHVISION, TORCHVISION_INSTALLED, assert_trains_bit_for_bit

if not TORCHVISION_INSTALLED:
    pytest.skip(NO_TORCHVISION, allow_module_level=True)
timm = pytest.importorskip("timm")

# name: (create_model's arguments, learning rate). EfficientNet's batch norm
# on a batch of 4 at 32x32 diverges at larger rates (eval logits ~1e17, NaN).
MODELS = {
    "resnet18": ({}, 0.05),
    "vit_tiny_patch16_224": ({"img_size": 32, "patch_size": 8}, 0.05),
    "convnext_atto": ({}, 0.05),
    "efficientnet_b0": ({}, 0.001),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_infers_and_trains_bit_for_bit(name):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 32, 32, generator=gen)
    y = torch.randint(0, 4, (4,), generator=gen)

    def make():
        torch.manual_seed(0)
        return timm.create_model(name, pretrained=False, num_classes=4, **MODELS[name][0])

    assert_trains_bit_for_bit(make, x, y, steps=2, lr=MODELS[name][1])
