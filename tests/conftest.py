"""Shared fixtures: the repository root (user kernels are imported from it) and small CPU settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

# Two cores on CI: one intra-op thread per process keeps timings steady and avoids oversubscription.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def in_repo_root(monkeypatch):
    """Run from the repository root, as `attn-gate` is run: `tests.buggy_kernels:NAME` imports."""
    monkeypatch.chdir(ROOT)
    return ROOT
