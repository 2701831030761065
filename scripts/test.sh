#!/usr/bin/env bash
# The tests: set up, then run pytest (CPU only; GPU measurements live in docs/results/, not in tests).
# Every tier, spread over the machine's cores (pytest-xdist); extra args go to pytest, e.g.
# `-m "not slow"` for the two-minute tier (docs/contributing.md) or `-n 0` to debug in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# --durations: the slowest tests are named in every log (CI's too), so a test that grows is seen.
exec python -m pytest -q -n auto --durations=25 "$@"
