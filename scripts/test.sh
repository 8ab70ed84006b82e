#!/usr/bin/env bash
# The test suite. Browser tests need Debian's chromium (`apt-get install -y chromium`); without it they are
# skipped with a message (under CI=true they fail instead).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
exec .venv/bin/python -m pytest "$@"
