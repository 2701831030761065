"""External programs some tests run (the pinned workflow linters, node): found next to this
interpreter or on PATH. Where one is absent the test is skipped with the reason and the install
line, so the suite runs in any venv with the `test` extra; in CI (env CI=true) an absent tool
fails the test instead, so the checks it carries can never be skipped there unnoticed."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(name: str, install: str) -> str:
    """The path of program `name`; absent: skip (fail in CI) saying how to install it."""
    found = BIN / name if (BIN / name).exists() else shutil.which(name)
    if found:
        return str(found)
    why = f"{name} is not installed ({install})"
    if in_ci():
        pytest.fail(f"{why}; CI must run this test, not skip it")
    pytest.skip(why)


def interpreter_path_prefix() -> str:
    """A bash line that puts this interpreter's scripts (python, attn-gate) first on PATH: what
    `. .venv/bin/activate` does in a workflow step, for whichever venv runs the tests."""
    return f'export PATH="{BIN}:$PATH"'
