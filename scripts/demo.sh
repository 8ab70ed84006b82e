#!/usr/bin/env bash
# The main job: 4 SFT configs (2 LoRA settings x 2 learning rates) on SmolLM2-135M-Instruct with the
# chatterbot-corpus tech_support pairs, trained concurrently in 4 chunks. Prints the runs table, names the
# best config and writes artifacts/sft_loss_curves.png.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
exec .venv/bin/python examples/sft_customer_support.py "$@"
