#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a virtualenv in .venv with attn-gate and its test tools.
# The venv sees system site-packages, so a GPU machine's own CUDA torch is used as it is; where no
# torch is importable, the CPU build (torch==2.13.0) is installed - never a multi-GB CUDA wheel -
# from ATTN_GATE_TORCH_INDEX_URL when set (one --index-url, never an extra index that could
# shadow a PyPI name). A second run is quiet and takes a second: the install is skipped while
# pyproject.toml (what it installs from) is unchanged since the last one that succeeded (its hash,
# in .venv/.attn-gate-setup).
#
# --locked (the trusted GPU jobs): no pip upgrade, no test tools, no resolver: every package from
# .ci/requirements-trusted.txt with its hash, wheels only, then attn-gate itself with no build
# isolation and no index. torch must be the runner's own.
#
# The interpreter: ATTN_GATE_PYTHON, which the runner guard sets on a self-hosted runner to the
# root-owned python3 it checked is read-only (never whichever python3 is first on PATH there);
# else PYTHON, else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${ATTN_GATE_PYTHON:-${PYTHON:-python3}}
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv --system-site-packages .venv
fi
. .venv/bin/activate
if [ "${1:-}" = "--locked" ]; then
  if ! python -c "import torch" >/dev/null 2>&1; then
    echo "::error::no torch in the runner's python3: the trusted jobs use the runner's own CUDA build (docs/ci.md)" >&2
    exit 1
  fi
  python -m pip install -q --require-hashes --only-binary :all: --no-deps -r .ci/requirements-trusted.txt
  python -m pip install -q --no-deps --no-build-isolation --no-index -e .
  exit 0
fi
stamp=.venv/.attn-gate-setup
want=$(python -c 'import hashlib, sys; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest(), sys.version)')
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && python -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ('gate', 'torch', 'pytest', 'xdist')))"; then
  exit 0
fi
# pip's and setuptools' chatter (index warnings, the editable-install banner) goes to a log that is
# shown only when the install fails
log=.venv/setup.log
{
  python -m pip install -q --upgrade pip
  if ! python -c "import torch" >/dev/null 2>&1; then
    python -m pip install -q ${ATTN_GATE_TORCH_INDEX_URL:+--index-url "$ATTN_GATE_TORCH_INDEX_URL"} torch==2.13.0
  fi
  python -m pip install -q -e '.[test]'
} >"$log" 2>&1 || { cat "$log" >&2; echo "scripts/setup.sh: the install failed (log above, kept in $log)" >&2; exit 1; }
echo "$want" >"$stamp"
