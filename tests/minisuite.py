"""The small projects the end-to-end tests run the real gate on: a mini suite's TOML, a config whose
own kernel is a function of a tests/ module, the CLI in this process or in a fresh one, git with a
fixed author, and examples/tiny-attn's kernel with the dK line a planted bug edits."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY_ATTN = (ROOT / "examples" / "tiny-attn" / "tiny_attn" / "__init__.py").read_text()
DK_LINE = "        dk = dk.view(b, hk, group, *dk.shape[2:]).sum(2)\n"  # where a planted dK bug goes


def suite(
    name: str,
    *,
    dtype: tuple[str, ...] = ("bf16",),
    seqlens: tuple[str, ...] = ("64",),
    heads: tuple[str, ...] = ("2",),
    head_dims: tuple[str, ...] = ("32",),
    causal: tuple[bool, ...] = (False, True),
    inputs: tuple[str, ...] = (),
) -> str:
    """[tool.attn-gate.suites.NAME]: one seed, one matrix; an empty `causal` or `inputs` leaves the axis out."""
    axes = {"dtype": dtype, "seqlens": seqlens, "heads": heads, "head_dims": head_dims, "causal": causal}
    axes["inputs"] = inputs
    rows = "".join(f"{key} = {json.dumps(list(values))}\n" for key, values in axes.items() if values)
    return f"\n[tool.attn-gate.suites.{name}]\nseeds = [0]\n[[tool.attn-gate.suites.{name}.matrix]]\n{rows}"


def project(path: Path, kernel: str, dense: str, suite_text: str, extra: str = "", baselines: str = "") -> Path:
    """The config PATH, whose own kernel KERNEL is DENSE (module:function), with SUITE_TEXT and
    EXTRA; its baselines in BASELINES, by default a `baselines` folder beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    where = baselines or (path.parent / "baselines").as_posix()
    path.write_text(
        f'[tool.attn-gate]\nbaselines_dir = "{where}"\n[tool.attn-gate.kernels.{kernel}]\ndense = "{dense}"\n'
        + suite_text
        + extra
    )
    return path


SHARED_DIR = "ATTN_GATE_TEST_SHARED_DIR"  # a folder the pytest runs of one checkout and machine share


def made_once(root: Path, make: Callable[[Path], None]) -> Path:
    """ROOT once `make(root)` has run in it: by the first process to take its lock (xdist's workers,
    the tiers of one scripts/test.sh through SHARED_DIR); the others wait for it, then read."""
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "done").exists():
            make(root)
            (root / "done").touch()
    return root


def gate(argv: list[str], cwd: Path = ROOT, columns: int | None = None) -> int:
    """`attn-gate ARGV` in this process from CWD (the root: tests.* kernels import), with no step
    summary to write; COLUMNS: the terminal's width."""
    from gate.commands.main import main

    with pytest.MonkeyPatch.context() as mp, contextlib.chdir(cwd):
        mp.delenv("GITHUB_STEP_SUMMARY", raising=False)
        if columns:
            mp.setenv("COLUMNS", str(columns))
        return main(argv)


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """CMD in a fresh process from CWD, without this pytest's or a CI job's variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GITHUB_"))}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900, env=env)


def attn_gate(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI in a fresh process, as a person types it: no warm worker holds an earlier kernel."""
    return run([str(Path(sys.executable).parent / "attn-gate"), *args], cwd)


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()
