#!/usr/bin/env bash
# The tests: set up, then run pytest (CPU only; GPU facts live in reports/, not in tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
exec python -m pytest -q "$@"
