#!/usr/bin/env bash
# The tests: set up, then run pytest (CPU only; GPU measurements live in docs/results/, not in tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
exec python -m pytest -q "$@"
