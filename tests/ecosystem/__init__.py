"""Tests of vision and diffusion libraries on `neuron` (timm, torchvision,
diffusers), offline, on small random-initialised models, against the CPU."""
