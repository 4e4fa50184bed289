"""diffusers on `neuron`: a tiny UNet2DModel's training step and a DDPMPipeline
run bit for bit the CPU's; the library's branches for AWS Neuron (written for
real Trainium, where random numbers are drawn on the host and 64-bit types are
narrowed) and what they do here, each a `test_gap_*` that fails once diffusers
changes them (docs/ecosystem.md).

Offline: the models are built from small configs in code, nothing is loaded."""
import copy

import pytest
import torch

import torchneuron  # noqa: F401

diffusers = pytest.importorskip("diffusers")
from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel  # noqa: E402
from diffusers.utils import torch_utils as diffusers_torch_utils  # noqa: E402

DEV = "neuron"
GAP = "diffusers changed its Neuron branch: update the gap in docs/ecosystem.md and this test"


def tiny_unet(seed=0):
    torch.manual_seed(seed)
    return UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
                       block_out_channels=(8, 16), norm_num_groups=4, attention_head_dim=8,
                       down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"))


def train_steps(unet, device, steps=2):
    """DDPM's training objective: noise a clean batch at random timesteps
    (scheduler.add_noise), predict the noise, MSE, SGD. Data drawn on the CPU."""
    unet = unet.to(device).train()
    scheduler = DDPMScheduler(num_train_timesteps=100)
    opt = torch.optim.SGD(unet.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        clean = torch.randn(2, 3, 8, 8, generator=gen).to(device)
        noise = torch.randn(2, 3, 8, 8, generator=gen).to(device)
        t = torch.randint(0, 100, (2,), generator=gen).to(device)
        noisy = scheduler.add_noise(clean, noise, t)
        loss = torch.nn.functional.mse_loss(unet(noisy, t).sample, noise)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu())
    return losses, {k: v.detach().cpu() for k, v in unet.state_dict().items()}


def test_unet_training_steps_bit_for_bit():
    unet = tiny_unet()
    cpu_losses, cpu_state = train_steps(copy.deepcopy(unet), "cpu")
    dev_losses, dev_state = train_steps(unet, DEV)
    assert all(torch.equal(a, b) for a, b in zip(cpu_losses, dev_losses)), (cpu_losses, dev_losses)
    assert cpu_state.keys() == dev_state.keys()
    for k in cpu_state:
        assert torch.equal(cpu_state[k], dev_state[k]), k
    assert not torch.equal(cpu_state["conv_in.weight"], tiny_unet().state_dict()["conv_in.weight"])  # it trained


def run_pipeline(device, generator, steps=3):
    pipe = DDPMPipeline(unet=tiny_unet().eval(), scheduler=DDPMScheduler(num_train_timesteps=steps))
    pipe.set_progress_bar_config(disable=True)
    pipe.to(device)
    return pipe(batch_size=2, generator=generator, num_inference_steps=steps, output_type="np").images


def test_ddpm_pipeline_with_a_cpu_generator_bit_for_bit():
    """The workaround for the generator gap below: a CPU generator. diffusers
    draws on the host for `neuron` anyway, so the noise, every denoising step
    and the images equal the CPU pipeline's."""
    cpu = run_pipeline("cpu", torch.Generator("cpu").manual_seed(0))
    dev = run_pipeline(DEV, torch.Generator("cpu").manual_seed(0))
    assert cpu.shape == (2, 8, 8, 3)
    assert (cpu == dev).all()


def test_neuron_generator_draws_its_own_stream():
    """Why no equality with the CPU is asked of a `neuron` generator: its
    counter-based stream is not the CPU's Mersenne Twister, as on CUDA."""
    g = torch.Generator(DEV).manual_seed(0)
    a = torch.randn(8, generator=g, device=DEV).cpu()
    b = torch.randn(8, generator=torch.Generator("cpu").manual_seed(0))
    assert not torch.equal(a, b)
    assert torch.equal(a, torch.randn(8, generator=torch.Generator(DEV).manual_seed(0), device=DEV).cpu())


def test_gap_pipeline_refuses_a_neuron_generator():
    """randn_tensor (diffusers/utils/torch_utils.py) sends every draw for a
    `neuron` tensor to the CPU ("Neuron does not support creating random
    tensors directly on device"), then calls torch.randn(device="cpu") with
    the caller's generator. A `neuron` generator there is refused as a CUDA
    generator is in the same call: the CPU kernel runs and names it
    (tests/test_generator.py). Given a CUDA generator for a CUDA tensor,
    randn_tensor draws on the device; once it does so for `neuron`, this fails."""
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'neuron'"):
        run_pipeline(DEV, torch.Generator(DEV).manual_seed(0))
    # the same draw without the library is made on the device
    g = torch.Generator(DEV).manual_seed(0)
    assert torch.randn(2, 3, generator=g, device=DEV).device.type == DEV
    try:
        diffusers_torch_utils.randn_tensor((2, 3), generator=torch.Generator(DEV).manual_seed(0),
                                           device=torch.device(DEV))
    except RuntimeError as e:
        assert "device type for generator" in str(e), e
        return
    pytest.fail(GAP)


def test_gap_narrows_64_bit_types_on_neuron():
    """diffusers lists `neuron` with mps and npu as devices without float64 and
    int64 (_FP64_UNSUPPORTED_DEVICES, _INT64_UNSUPPORTED_DEVICES), so
    pipelines that ask maybe_adjust_dtype_for_device (PixArt-alpha's
    timesteps, Flux2 Klein's and PRX's position ids) narrow them to float32
    and int32 on `neuron`; here both types are exact, as on the CPU."""
    adjust = diffusers_torch_utils.maybe_adjust_dtype_for_device
    x = torch.tensor([1 / 3, 2.0 ** 60 + 1], dtype=torch.float64)
    assert torch.equal((x * 3).cpu(), (x.to(DEV) * 3).cpu())
    i = torch.tensor([2 ** 40 + 1], dtype=torch.int64)
    assert torch.equal(i * 5, (i.to(DEV) * 5).cpu())
    assert adjust(torch.float64, torch.device("cpu")) == torch.float64
    assert (adjust(torch.float64, torch.device(DEV)), adjust(torch.int64, torch.device(DEV))) == \
        (torch.float32, torch.int32), GAP
