"""Tests of the Hugging Face stack on `neuron` (transformers, accelerate, peft,
sentence-transformers), offline, on small random-initialised models."""
