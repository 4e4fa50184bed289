"""Ecosystem tests run offline: every model is built from a small config in
code, nothing is downloaded. Set before any test module imports a library that
reads these at import (diffusers and timm through huggingface_hub)."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Before any test module imports diffusers, timm or transformers, all of which
# import torchvision when it is installed: PyPI's CUDA wheel needs the stand-in
# operator definitions of vision_testing.py to import at all.
from . import vision_testing  # noqa: E402,F401
