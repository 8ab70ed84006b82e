#!/usr/bin/env bash
# The main job: 4 SFT configs (2 LoRA settings x 2 learning rates) on SmolLM2-135M-Instruct with a construction
# company's customer FAQ (CC BY 4.0), trained concurrently in 4 chunks and judged by eval loss and by the ROUGE-L of
# their generated answers. Prints the runs table, names the best config and writes artifacts/sft_loss_curves.png.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
exec .venv/bin/python examples/sft_customer_support.py "$@"
