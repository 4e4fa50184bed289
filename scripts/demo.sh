#!/usr/bin/env bash
# The main job: set up, then train the small GPT on `neuron` (and the same model
# on the CPU for comparison). Figures and the loss curve go to artifacts/.
# Arguments go to examples/train_gpt.py; --profile profiles a few training steps
# instead and prints the path of the explorer's report (artifacts/profile/report.html).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
exec .venv/bin/python examples/train_gpt.py "$@"
