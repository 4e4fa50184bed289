"""Ecosystem tests run offline: every model is built from a small config in
code, nothing is downloaded. Set before any test module imports a library that
reads these at import (diffusers and timm through huggingface_hub)."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
