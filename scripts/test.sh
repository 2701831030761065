#!/usr/bin/env bash
# The tests: set up, then run pytest (CPU only; GPU measurements live in docs/results/, not in tests).
# Every tier, spread over the machine's cores (pytest-xdist); extra args go to pytest instead, e.g.
# `-m "not slow"` for the two-minute tier (docs/contributing.md) or `-n 0` to debug in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# Bytecode is cached: with PYTHONDONTWRITEBYTECODE set (some images set it) every pytest worker
# rewrites the asserts of each test module and each gate module (a plugin's package) again.
unset PYTHONDONTWRITEBYTECODE
# this machine's CPU baseline, which the tests judge against, is recorded once for both tiers
ATTN_GATE_TEST_SHARED_DIR=$(mktemp -d)
export ATTN_GATE_TEST_SHARED_DIR
trap 'rm -rf "$ATTN_GATE_TEST_SHARED_DIR"' EXIT
# --durations: the slowest tests are named in every log (CI's too), so a test that grows is seen.
if [ $# -eq 0 ]; then
  # every tier, the fast one first: a broken change fails within its two minutes, and each tier's
  # own time stands in the log ("N passed in S s"), CI's included
  python -m pytest -q -n auto --durations=10 -m "not slow"
  python -m pytest -q -n auto --durations=25 -m slow
  exit
fi
python -m pytest -q -n auto --durations=25 "$@"
