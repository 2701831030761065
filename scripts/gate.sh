#!/usr/bin/env bash
# The main job: set up, then gate the configured kernel against this machine's baselines
# (torch's CPU attention against baselines/cpu/ on a CPU-only machine). Extra args go to `check`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
exec attn-gate check "$@"
