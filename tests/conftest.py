"""Shared fixtures: the repository root (user kernels are imported from it) and CPU settings.
Nothing here imports torch: the pure tests run without it."""

from __future__ import annotations

import os
import sys

# One intra-op thread, here and in every `attn-gate` subprocess a test starts (they inherit the
# environment). The test shapes are tiny, so threads buy nothing, and with more busy threads than
# cores OpenMP's spin-waiting is pathological: a tiled smoke sweep measured 4-6 s with one thread
# and 115-130 s with two on a loaded 2-core machine. An explicit setting is respected.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# torch reads OMP_NUM_THREADS when it starts; one already started (by a plugin) is told here
if "torch" in sys.modules:
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def in_repo_root(monkeypatch):
    """Run from the repository root, as `attn-gate` is run: `tests.buggy_kernels:NAME` imports."""
    monkeypatch.chdir(ROOT)
    return ROOT
