"""The terminal of a failing `attn-gate check` ends as pytest's does: counts in cases, the shared
pattern, a command that reruns exactly the failing cases, the Markdown report's path and the
verdict with its worst case, all within the last 8 lines; case ids are never cut, however narrow
the terminal; `--last-failed` reruns the failures of the last run in --out; a misspelt flag or
subcommand gets the nearest name."""

from __future__ import annotations

import contextlib
import json

import pytest

from gate.commands.main import main
from tests.minisuite import ROOT, gate, project, suite

KERNEL = "tests.coverage_kernels:dq_head_dim_tail_dropped"  # dQ wrong where head_dim % 32 != 0
# the smoke head-dim cases with one head dim for Q, K and V (the pairs have their own tests), two controls
ONLY = r"^bf16-b2-h2-s33x65-d\d+$|^bf16-b2-h4-s128-d64"
FAILING = {"bf16-b2-h2-s33x65-d59", "bf16-b2-h2-s33x65-d72", "bf16-b2-h2-s33x65-d111"}


@pytest.fixture(autouse=True)
def no_step_summary(monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


@pytest.mark.slow
def test_the_last_lines_of_a_failing_check_say_what_failed_and_what_to_do(cpu_baseline, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "60")  # narrow: the other columns wrap, no case id is cut
    out = tmp_path / "out"
    assert (
        gate(
            [
                "check",
                "--kernel",
                KERNEL,
                "--baseline",
                str(cpu_baseline.path),
                f"--only={ONLY}",
                "--device",
                "cpu",
                "--no-progress",
                "--out",
                str(out),
            ]
        )
        == 1
    )
    text = capsys.readouterr().out
    # the summary's logical lines: a wrapped one continues on lines indented by two spaces
    logical: list[str] = []
    for line in text.strip().splitlines():
        if line.startswith("  ") and logical:
            logical[-1] += " " + line.strip()
        else:
            logical.append(line)
    tail = "\n".join(logical[-12:])
    verdict = next(line for line in tail.splitlines() if line.startswith("FAIL: "))
    assert "correctness FAIL in 3 of 6 cases" in verdict and "worst bf16-b2-h2-s33x65-d" in verdict, tail
    pattern = next(line for line in tail.splitlines() if line.startswith("pattern: "))
    assert "every failing tensor is dq (3 cases)" in pattern, pattern
    assert "every failing case (3) has a head dim not a multiple of 32; none of the 3 passing cases does" in pattern
    assert {line.split()[1] for line in tail.splitlines() if line.startswith("FAIL bf16-")} == FAILING
    rerun = next(line for line in tail.splitlines() if line.startswith("rerun: "))
    assert rerun == f"rerun: attn-gate check --last-failed --out {out}"
    report = next(line for line in tail.splitlines() if line.startswith("report: "))
    assert report == f"report: {out / 'check-tests.coverage_kernels_dq_head_dim_tail_dropped-smoke.md'}"
    assert "cases: 3 failed, 3 passed of 6" in tail
    table = text.split("thresholds:")[0]
    assert all(cid in table for cid in FAILING)  # whole, on one line of the 60-column table, or not in a table at all

    # --last-failed: the failures of the last run in --out, without copying ids
    capsys.readouterr()
    assert (
        gate(
            [
                "check",
                "--kernel",
                KERNEL,
                "--baseline",
                str(cpu_baseline.path),
                "--device",
                "cpu",
                "--no-progress",
                "--out",
                str(out),
                "--last-failed",
            ]
        )
        == 1
    )
    (sweep,) = out.glob("sweep-*.json")  # the first run was filtered too: the rerun replaces it
    assert {c["case_id"] for c in json.loads(sweep.read_text())["cases"]} == FAILING


def test_last_failed_without_a_last_run_is_a_usage_error(tmp_path, capsys):
    assert (
        main(["check", "--kernel", "sdpa-cpu", "--device", "cpu", "--out", str(tmp_path / "none"), "--last-failed"])
        == 2
    )
    err = capsys.readouterr().err
    assert "--last-failed" in err and "no findings" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "argv,hint",
    [
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
    ],
)
def test_a_misspelt_subcommand_or_flag_gets_the_nearest_name(argv, hint, capsys):
    assert main(argv) == 2
    assert hint in capsys.readouterr().err


def test_workers_0_with_resume_is_a_usage_error(tmp_path, capsys):
    """The in-process run keeps no journal: --resume would be ignored and every case rerun."""
    assert (
        main(
            [
                "sweep",
                "--kernel",
                "sdpa-cpu",
                "--device",
                "cpu",
                "--out",
                str(tmp_path / "out"),
                "--workers",
                "0",
                "--resume",
                "--no-progress",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--resume with --workers 0" in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------- a terminal a person reads, at 80 and 120 columns

SUITE = suite("tiny", inputs=("normal", "shifted", "large"))
SHIFTED = ("bf16-b2-h2-s64-d32-causal-shifted", "bf16-b2-h2-s64-d32-shifted")
BOX = "│┃┏┓┗┛┡┩└┘━─┳┻╇┼┬┴"


def _run(repo, monkeypatch, capsys, width: int, *argv: str) -> tuple[int, str]:
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the workers import tests.regime_kernels
    with contextlib.chdir(repo):
        rc = main([*argv, "--no-progress"])
    return rc, capsys.readouterr().out


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory):
    """A repository whose kernel `mine` had a clean baseline and is now wrong on shifted inputs."""
    repo = tmp_path_factory.mktemp("terminal")
    project(repo / "pyproject.toml", "mine", "tests.regime_kernels:fixed", SUITE, baselines="baselines")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", str(ROOT))
        argv = ["baseline", "update", "--kernel", "mine", "--suite", "tiny", "--device", "cpu", "--no-progress"]
        assert gate(argv, cwd=repo) == 0
    project(repo / "pyproject.toml", "mine", "tests.regime_kernels:shifted_nan_dv", SUITE, baselines="baselines")
    return repo


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.xdist_group("check_terminal")
def test_the_terminal_fits_its_width_with_whole_words_worst_case_first(tiny_repo, tmp_path, monkeypatch, capsys, width):
    import shutil as sh

    repo = tmp_path / "repo"
    sh.copytree(tiny_repo, repo)
    rc, text = _run(repo, monkeypatch, capsys, width, "check", "--kernel", "mine", "--suite", "tiny", "--device", "cpu")
    assert rc == 1
    lines = text.rstrip("\n").splitlines()
    too_long = [line for line in lines if len(line) > width]
    assert not too_long, too_long
    # a wrapped line ends with its last word (a table's centred title is padded on both sides)
    assert [line for line in lines if line != line.rstrip() and line == line.lstrip()] == []
    # no word is split: every word of what a table or a line says is whole somewhere in the output
    tokens = set(text.translate({ord(c): " " for c in BOX}).split())
    findings = json.loads((repo / "out" / "findings-mine-tiny.json").read_text())["findings"]
    words = {w for f in findings if f["severity"] == "FAIL" for w in f["message"].split() if len(w) > 2}
    assert words - tokens == set(), sorted(words - tokens)[:5]
    assert set(SHIFTED) <= tokens
    # one line per failing case, pytest's short-summary style, the worst (the NaN) first; then the
    # pattern, the short rerun hint, the report
    fails = [line for line in lines if line.startswith("FAIL bf16-")]
    assert fails[0] == f"FAIL {SHIFTED[0]}  NaN in dv"
    assert fails[1].startswith(f"FAIL {SHIFTED[1]}  dq ") and fails[1].endswith("x its bound")
    after = lines[lines.index(fails[-1]) + 1 :]
    assert after[0].startswith("pattern: ")
    pattern = " ".join(line.strip() for line in after[:3])
    assert "every failing case (2) has shifted inputs; none of the 4 passing cases does" in pattern
    rerun = next(line for line in after if line.startswith("rerun: "))
    assert rerun == "rerun: attn-gate check --last-failed"

    # the rerun hint runs as printed, and writes beside the full report, not over it
    full = (repo / "out" / "check-mine-tiny.md").read_text()
    rc, again = _run(repo, monkeypatch, capsys, width, *rerun.split(": ", 1)[1].split()[1:])
    assert rc == 1 and (repo / "out" / "check-mine-tiny.md").read_text() == full
    rerun_sweep = json.loads((repo / "out" / "sweep-mine-tiny.only.json").read_text())
    assert {c["case_id"] for c in rerun_sweep["cases"]} == set(SHIFTED)
    assert "report: out/check-mine-tiny.only.md" in again
    assert all(len(line) <= width for line in again.splitlines())


def test_the_rerun_hint_keeps_perf_where_a_speed_finding_blocks():
    from gate.compare.findings import Finding, Severity, Subject, decide
    from gate.report.check_report import rerun_hint

    slow = Finding("speed", Severity.FAIL, "c", Subject.speed("bwd"), 1.0, 3.0, 1.05, "c: bwd 3x slower")
    wrong = Finding("tolerance", Severity.FAIL, "c", Subject.ratio("dq"), 0.1, 2.0, 1.0, "c: dq error is 2 x its bound")
    assert rerun_hint(decide([wrong])) == "attn-gate check --last-failed"
    assert rerun_hint(decide([wrong, slow])) == "attn-gate check --last-failed --perf"
    assert rerun_hint(decide([wrong]), "ci-out/check-k-s.md") == "attn-gate check --last-failed --out ci-out"


@pytest.mark.parametrize("width", [30, 40, 60])
def test_a_short_code_span_is_never_split_and_a_long_command_still_wraps(width):
    from gate.report import wrap_words

    setting = "`causal_seqlen_q_ne_k = false`"
    command = "`attn-gate baseline update --kernel mypkg.attn:attn_func --suite pr --known WHY`"
    lines = wrap_words(f"narrow the envelope: declare {setting} in the supports table; or run {command}", width)
    assert any(setting in line for line in lines)  # the setting as it is pasted
    assert " ".join(line.strip() for line in lines).count(setting) == 1
    assert all(len(line) <= max(width, len(setting) + 2) for line in lines)  # the command wrapped, at words
    assert not any(command in line for line in lines)
    # a long span before a short one: the pairs are the spans, not the text between them
    lines = wrap_words(f"or run {command} and then declare {setting} in the table", width)
    assert any(setting in line for line in lines)
    assert " ".join(line.strip() for line in lines) == f"or run {command} and then declare {setting} in the table"


@pytest.mark.xdist_group("check_terminal")
def test_last_failed_after_a_passing_check_runs_every_case_as_pytest_does(tiny_repo, tmp_path, monkeypatch, capsys):
    import shutil as sh

    repo = tmp_path / "repo"
    sh.copytree(tiny_repo, repo, ignore=sh.ignore_patterns("out"))  # the baseline's own sweep stays behind
    project(repo / "pyproject.toml", "mine", "tests.regime_kernels:fixed", SUITE, baselines="baselines")
    argv = ("check", "--kernel", "mine", "--suite", "tiny", "--device", "cpu")
    assert _run(repo, monkeypatch, capsys, 80, *argv, "--only", "shifted")[0] == 0  # some cases, all passing
    assert len(json.loads((repo / "out" / "sweep-mine-tiny.json").read_text())["cases"]) == 2
    with contextlib.chdir(repo):
        assert main(["check", "--last-failed", "--no-progress"]) == 0
    assert "no case failed in the last check in out: every case runs" in " ".join(capsys.readouterr().err.split())
    whole = json.loads((repo / "out" / "sweep-mine-tiny.json").read_text())
    assert len(whole["cases"]) == 6 and whole["scope"] is None  # 2 causal x 3 inputs: the whole suite
