"""Autocast on `neuron`: CUDA's casting lists, and the supported dtypes."""
import pytest
import torch
import torch.nn as nn


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_follows_cuda_lists(dtype):
    lin = nn.Linear(8, 8).neuron()
    x = torch.randn(4, 8, device="neuron")
    with torch.autocast(device_type="neuron", dtype=dtype):
        y = lin(x)
        s = torch.softmax(y, dim=-1)  # an fp32 op on CUDA's lists
    assert y.dtype == dtype
    assert s.dtype == torch.float32
    assert torch.neuron.get_amp_supported_dtype() == [torch.float32, torch.float16, torch.bfloat16]
    assert torch.neuron.is_bf16_supported()

