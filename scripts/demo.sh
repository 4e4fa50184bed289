#!/usr/bin/env bash
# The main job: set up, then train the small GPT on `neuron` (and the same model
# on the CPU for comparison). Figures and the loss curve go to artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
exec .venv/bin/python examples/train_gpt.py "$@"
