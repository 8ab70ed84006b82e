#!/usr/bin/env bash
# Lint, format check and types (part of CI): ruff (rules and formatter in pyproject.toml) over the repository,
# mypy --strict on the pure core (kernel_scheduler, the run spec and schema, the view package, devices).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy kernel_scheduler rapidfire_nb/spec rapidfire_nb/schema rapidfire_nb/view rapidfire_nb/devices
