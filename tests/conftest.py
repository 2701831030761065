"""Shared fixtures: the repository root (user kernels are imported from it), CPU settings and the
CPU baseline of this machine. Nothing here imports torch: the pure tests run without it."""

from __future__ import annotations

import contextlib
import io
import os
import sys

# One intra-op thread, here and in every `attn-gate` subprocess a test starts (they inherit the
# environment). The test shapes are tiny, so threads buy nothing, and with more busy threads than
# cores OpenMP's spin-waiting is pathological: a tiled smoke sweep measured 4-6 s with one thread
# and 115-130 s with two on a loaded 2-core machine. An explicit setting is respected.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.minisuite import SHARED_DIR, gate, made_once  # noqa: E402

# torch reads OMP_NUM_THREADS when it starts; one already started (by a plugin) is told here
if "torch" in sys.modules:
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(items):
    """The slow tests first, in their order; under xdist the tests started last end the run, and a
    slow one among them would keep the other workers idle while it finishes."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def in_repo_root(monkeypatch):
    """Run from the repository root, as `attn-gate` is run: `tests.buggy_kernels:NAME` imports."""
    monkeypatch.chdir(ROOT)
    return ROOT


@dataclass(frozen=True)
class LocalBaseline:
    """sdpa-cpu on smoke recorded on this machine: the baseline and the sweep it was made from."""

    path: Path  # <folder>/cpu/sdpa-cpu-smoke.json, in the layout `check` expects under baselines_dir
    sweep: Path  # the sweep JSON of the same run (its validation note beside it)
    config: Path  # a pyproject.toml whose baselines_dir holds `path`: `check --config` finds it by default
    said: Path  # what `attn-gate sweep` printed, stdout then stderr (no terminal, COLUMNS unset: as in CI)


@pytest.fixture(scope="session")
def cpu_baseline(tmp_path_factory) -> LocalBaseline:
    """The CPU baseline the tests judge against, recorded once per test session by the gate
    itself on the machine that runs them: the committed one holds one torch build and the CPU
    models of CI, where another machine's ratios differ with no change to the code
    (test_check_cli.py's committed-baseline test checks that one, as CI's gate does).
    pytest-xdist's workers share one recording: the first to take the lock makes it; so do the
    pytest runs of one scripts/test.sh (its tiers), through SHARED_DIR."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get(SHARED_DIR):
        shared = Path(os.environ[SHARED_DIR])
    elif os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the folder every worker's base temp lives in
    root = shared / "cpu-baseline"
    local = LocalBaseline(
        root / "baselines" / "cpu" / "sdpa-cpu-smoke.json",
        root / "out" / "sweep-sdpa-cpu-smoke.json",
        root / "pyproject.toml",
        root / "said.json",
    )
    made_once(root, lambda _: _record(local, root))
    return local


def _run(argv: list[str]) -> tuple[int, str, str]:
    """`attn-gate ARGV` in this process from the root, its output captured (not a terminal, COLUMNS unset)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        mp.delenv("COLUMNS", raising=False)
        rc = gate(argv)
    return rc, stdout.getvalue(), stderr.getvalue()


def _record(local: LocalBaseline, root: Path) -> None:
    """The sweep (whose output test_sweep_cli.py reads as a user's `attn-gate sweep`), then the
    baseline made from it, as `baseline update --from-results` makes one from a CI artifact."""
    import json

    local.config.write_text(f'[tool.attn-gate]\nbaselines_dir = "{(root / "baselines").as_posix()}"\n')
    config = ["--config", str(local.config)]
    argv = ["sweep", "--kernel", "sdpa-cpu", "--suite", "smoke", "--device", "cpu", *config]
    rc, stdout, stderr = _run([*argv, "--out", str(local.sweep.parent), "--no-progress"])
    assert rc == 0, f"the sweep for this machine's CPU baseline failed (exit {rc}):\n{stdout}{stderr}"
    local.said.write_text(json.dumps({"stdout": stdout, "stderr": stderr}))
    rc, stdout, stderr = _run(["baseline", "update", "--from-results", str(local.sweep), *config])
    assert rc == 0, f"recording this machine's CPU baseline failed (exit {rc}):\n{stdout}{stderr}"
