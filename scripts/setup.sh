#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a virtualenv in .venv with attn-gate and its test tools.
# The venv sees system site-packages, so a GPU machine's own CUDA torch is used as it is; where no
# torch is importable, the CPU build (torch==2.13.0) is installed - never a multi-GB CUDA wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv --system-site-packages .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
if ! python -c "import torch" >/dev/null 2>&1; then
  python -m pip install -q torch==2.13.0
fi
python -m pip install -q -e '.[test]'
