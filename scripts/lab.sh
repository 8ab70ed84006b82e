#!/usr/bin/env bash
# Open the tutorial notebooks in JupyterLab, with the project's .venv as the kernel ("Python 3 (ipykernel)").
# Creates or reuses .venv first (scripts/setup_venv.sh). Extra arguments go to JupyterLab, e.g.
#   bash scripts/lab.sh --port 8890 --no-browser
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
# The kernel inherits PATH: .venv/bin first, so shell commands in cells (!pip, !tensorboard) use the venv.
export PATH="$PWD/.venv/bin:$PATH"
exec .venv/bin/python -m jupyterlab --notebook-dir=notebooks "$@"
