#!/usr/bin/env bash
# The tests: set up, then run pytest (CPU only; GPU measurements live in docs/results/, not in tests).
# Every tier, spread over the machine's cores (pytest-xdist); extra args go to pytest, e.g.
# `-m "not slow"` for the two-minute tier (docs/contributing.md) or `-n 0` to debug in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# --durations: the slowest tests are named in every log (CI's too), so a test that grows is seen.
if [ $# -gt 0 ]; then
  exec python -m pytest -q -n auto --durations=25 "$@"
fi
# Without arguments (CI), the two tiers one after the other, so the log times each: the fast tier
# a contributor runs while working, then the end-to-end runs (docs/contributing.md).
start=$SECONDS fast=0 slow=0
python -m pytest -q -n auto -m "not slow" --durations=10 || fast=$?
python -m pytest -q -n auto -m slow --durations=25 || slow=$?
echo "scripts/test.sh: both tiers in $((SECONDS - start)) s (exit codes: fast $fast, slow $slow)"
[ "$fast" = 0 ] && [ "$slow" = 0 ]
