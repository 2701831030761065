"""The terminal of a failing `attn-gate check` ends as pytest's does: counts in cases, the shared
pattern, a command that reruns exactly the failing cases, the Markdown report's path and the
verdict with its worst case, all within the last 8 lines; case ids are never cut, however narrow
the terminal; `--last-failed` reruns the failures of the last run in --out; a misspelt flag or
subcommand gets the nearest name."""

from __future__ import annotations

import contextlib
import json
import shlex

import pytest

from gate.commands.main import main
from tests.conftest import ROOT

CPU_BASELINE = ROOT / "baselines" / "cpu" / "sdpa-cpu-smoke.json"
KERNEL = "tests.coverage_kernels:dq_head_dim_tail_dropped"  # dQ wrong where head_dim % 32 != 0
# the smoke head-dim cases with one head dim for Q, K and V (the pairs have their own tests), two controls
ONLY = r"^bf16-b2-h2-s33x65-d\d+$|^bf16-b2-h4-s128-d64"
FAILING = {"bf16-b2-h2-s33x65-d59", "bf16-b2-h2-s33x65-d72", "bf16-b2-h2-s33x65-d111"}


@pytest.fixture(autouse=True)
def no_step_summary(monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


@pytest.mark.slow
def test_the_last_lines_of_a_failing_check_say_what_failed_and_what_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "60")  # narrow: the other columns wrap, no case id is cut
    out = tmp_path / "out"
    with contextlib.chdir(ROOT):
        assert main(["check", "--kernel", KERNEL, "--baseline", str(CPU_BASELINE), f"--only={ONLY}", "--device", "cpu",
                     "--no-progress", "--out", str(out)]) == 1
    text = capsys.readouterr().out
    tail = "\n".join(text.strip().splitlines()[-8:])
    verdict = next(line for line in tail.splitlines() if line.startswith("FAIL: "))
    assert "correctness FAIL in 3 of 6 cases" in verdict and "worst bf16-b2-h2-s33x65-d" in verdict, tail
    pattern = next(line for line in tail.splitlines() if line.startswith("pattern: "))
    assert "every failing tensor is dq (3 cases)" in pattern, pattern
    assert "every failing case (3) has a head dim not a multiple of 32; none of the 3 passing cases does" in pattern
    rerun = next(line for line in tail.splitlines() if line.startswith("rerun: "))
    assert rerun.startswith("rerun: attn-gate check --kernel " + KERNEL)
    report = next(line for line in tail.splitlines() if line.startswith("report: "))
    assert report == f"report: {out / 'check-tests.coverage_kernels_dq_head_dim_tail_dropped-smoke.md'}"
    assert "cases: 3 failed, 3 passed of 6" in tail
    table = text.split("thresholds:")[0]
    assert all(cid in table for cid in FAILING)  # whole, on one line of the 60-column table

    # the printed rerun command runs exactly the failing cases
    argv = shlex.split(rerun.split(": ", 1)[1])[1:]
    assert "--only" in argv
    # --last-failed: the failures of the last run in --out, without copying ids
    capsys.readouterr()
    with contextlib.chdir(ROOT):
        assert main(["check", "--kernel", KERNEL, "--baseline", str(CPU_BASELINE), "--device", "cpu", "--no-progress",
                     "--out", str(out), "--last-failed"]) == 1
    (sweep,) = out.glob("sweep-*.json")
    assert {c["case_id"] for c in json.loads(sweep.read_text())["cases"]} == FAILING


def test_last_failed_without_a_last_run_is_a_usage_error(tmp_path, capsys):
    assert main(["check", "--kernel", "sdpa-cpu", "--device", "cpu", "--out", str(tmp_path / "none"), "--last-failed"]) == 2
    err = capsys.readouterr().err
    assert "--last-failed" in err and "no findings" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv,hint", [
    (["chek"], "did you mean check?"),
    (["check", "--kernal", "x"], "--kernal: did you mean --kernel?"),
    (["sweep", "--no-progess"], "--no-progess: did you mean --no-progress"),
    (["baseline", "updte"], "did you mean update?"),
    (["--verison"], "--verison: did you mean --version?"),
    (["--verison", "check"], "--verison: did you mean --version?"),
    # a flag of other commands is named as such, never suggested as its own correction
    (["perf", "--no-progress"], "`attn-gate perf` has no --no-progress (a flag of baseline update, check, "),
    (["baseline", "update", "--perf-form", "x"], "--perf-form: did you mean --perf-from"),
    (["--kernel", "x", "check"], "--kernel goes after the command (a flag of "),
])
def test_a_misspelt_subcommand_or_flag_gets_the_nearest_name(argv, hint, capsys):
    assert main(argv) == 2
    assert hint in capsys.readouterr().err


def test_workers_0_with_resume_is_a_usage_error(tmp_path, capsys):
    """The in-process run keeps no journal: --resume would be ignored and every case rerun."""
    assert main(["sweep", "--kernel", "sdpa-cpu", "--device", "cpu", "--out", str(tmp_path / "out"), "--workers", "0",
                 "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--resume with --workers 0" in err and len(err.strip().splitlines()) == 1, err
