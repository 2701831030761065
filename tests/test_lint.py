"""The tree is lint-clean and formatted as ruff (pinned in the `test` extra) writes it: a new
release changes the formatter's output, so the pin moves on purpose."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.tools import require

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args", [("check", "."), ("format", "--check", ".")], ids=["check", "format"])
def test_ruff_is_clean(args):
    ruff = require("ruff", "pip install -e '.[test]'")
    r = subprocess.run([ruff, *args], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_finds_an_unused_import(tmp_path):
    # the check above can fail: the same configuration flags a planted violation
    ruff = require("ruff", "pip install -e '.[test]'")
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    r = subprocess.run(
        [ruff, "check", "--config", str(ROOT / "pyproject.toml"), str(bad)], capture_output=True, text=True
    )
    assert r.returncode == 1 and "F401" in r.stdout
