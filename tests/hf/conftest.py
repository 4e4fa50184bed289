"""Hugging Face tests run offline: nothing is downloaded, every model is built
from a small config in code (or shipped in a package). Set before any test
module imports transformers, which reads these at import."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
