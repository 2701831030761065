"""`attn-gate bisect`: a synthetic kernel repository of six commits (examples/tiny-attn's kernel, a
two-case suite, a committed CPU baseline) where commit 5 plants a bug; the bisect names it, skips a
commit that does not build, refuses a good end that fails, and stops on a flaky kernel. The step's
decision (gate/workflow/bisect.py `decide_step`, `read_failing`) is tested on tables first.

The bisect runs in this process (the installed script's run is test_rehearsal.py's bisect.yml);
each check it makes is a fresh `attn-gate check` process either way."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from gate.core.cases import exact_regex
from gate.core.errors import UserError
from gate.workflow.bisect import (
    BAD,
    FLAKY,
    GOOD,
    SKIP,
    BisectOutcome,
    BisectSpec,
    StepResult,
    check_command,
    decide_step,
    listed,
    step_verdict,
)
from tests.minisuite import DK_LINE, SHARED_DIR, TINY_ATTN, gate, git, made_once, suite

PLANTED = DK_LINE + "        dk = dk * 1.02\n"
# a bug on every other import of the module (one import per check: its one worker), counted beside
# it: per checkout, so the checks of one step count alone, and with no variable that makes the gate
# start another zygote for this process's environment
FLAKY_KERNEL = (
    "import os as _os\n_path = _os.path.join(_os.path.dirname(__file__), 'imports')\n"
    "_n = int(open(_path).read() or 0) + 1 if _os.path.exists(_path) else 1\n"
    "open(_path, 'w').write(str(_n))\n_FLAKY = _n % 2 == 1\n"
)
PYPROJECT = (
    '[tool.attn-gate.cpu]\nkernel = "tinyk:flash_attn_func"\nsuite = "mini"\n'
    '[tool.attn-gate.ci]\nsetup = "python3 -m py_compile tinyk/__init__.py"\n'
    + suite("mini", dtype=("fp32",), seqlens=("33", "40x56"), head_dims=("16",), causal=())
)
CASES = ["fp32-b2-h2-s33-d16", "fp32-b2-h2-s40x56-d16"]


# ---------------------------------------------------------------- the step's decision, on tables


def test_a_step_is_what_every_run_agrees_on():
    bad = (BAD, "x (dk)", {"x": ["dk"]})
    assert decide_step("c", "s", [bad, bad]).verdict == BAD
    assert decide_step("c", "s", [(GOOD, "", {}), (GOOD, "", {})]).verdict == GOOD
    assert decide_step("c", "s", [(SKIP, "no build", {})]).verdict == SKIP


@pytest.mark.parametrize(
    "runs, flipped",
    [
        ([(BAD, "x (dk)", {"x": ["dk"]}), (GOOD, "", {})], ("x",)),
        ([(GOOD, "", {}), (BAD, "y (dq)", {"y": ["dq"]})], ("y",)),
        ([(BAD, "", {"x": ["dk"]}), (BAD, "", {"x": ["dk"], "y": ["dv"]})], ("y",)),  # the same verdict, another case
        ([(BAD, "", {"x": ["dk"]}), (SKIP, "crash", {})], ("x",)),
    ],
)
def test_a_verdict_that_changes_on_a_rerun_is_flaky_and_names_the_case(runs, flipped):
    step = decide_step("c", "s", runs)
    assert step.verdict == FLAKY and step.flipped == flipped and step.exit_code == 128


def finding(case, metric, severity):
    return {"case_id": case, "metric": metric, "severity": severity, "message": f"{case} {metric}"}


def test_a_bad_step_names_the_tensors_its_bisected_cases_failed_on():
    findings = [
        finding("a", "ratio:dk", "FAIL"),
        finding("a", "ratio:dq", "FAIL"),
        finding("a", "status", "FAIL"),
        finding("a", "ratio:dv", "WARN"),
        finding("c", "status", "FAIL"),
        finding("b", "ratio:out", "FAIL"),
        finding("d", "status", "OK"),
    ]
    verdict, reason, failing = step_verdict(1, findings, ("a", "c", "d"))
    assert verdict == BAD and failing == {"a": ["dk", "dq"], "c": ["status"]} and reason == "a (dk, dq); c (status)"
    assert step_verdict(1, [finding("", "env:torch", "FAIL")], ("a",))[:2] == (BAD, " env:torch")
    assert step_verdict(0, [finding("a", "ratio:dk", "OK")], ("a",))[0] == GOOD


def test_a_long_list_of_failing_cases_says_how_many_it_leaves_out():
    """A step line holds 300 characters: the cases past them were cut off with no word."""
    cases = tuple(f"bf16-b2-h8-s{n}-d128-causal" for n in range(40))
    verdict, reason, failing = step_verdict(1, [finding(c, "ratio:dk", "FAIL") for c in cases], cases)
    shown = reason.split("; ")[:-1]
    assert verdict == BAD and len(failing) == 40 and len(reason) <= 300
    assert (
        reason.endswith(f"; ... {40 - len(shown)} more") and shown == [f"{c} (dk)" for c in sorted(cases)][: len(shown)]
    )
    assert listed(["a", "b"], ", ", 10) == "a, b"
    assert listed(["aaaa", "bbbb", "cccc"], ", ", 12) == "aaaa, ... 2 more"


@pytest.mark.parametrize(
    "findings",
    [
        [finding("a", "speed_ratio:fwd", "INCONCLUSIVE")],  # a suspected regression the confirm re-run did not confirm
        [finding("", "speed", "INCONCLUSIVE"), finding("a", "ratio:dk", "WARN")],
        None,  # no findings JSON
        [],
    ],
)
def test_a_step_without_a_fail_is_skipped_not_bad(findings):
    assert step_verdict(1, findings, ("a",))[0] == SKIP


def test_a_perf_bisect_times_the_cases_in_each_check(tmp_path):
    spec = BisectSpec(
        repo="/r",
        good="a" * 40,
        bad="b" * 40,
        cases=("x",),
        only="^(?:x)$",
        kernel="k",
        suite="s",
        device="cpu",
        config="/w/judge/pyproject.toml",
        baseline="/w/b.json",
        setup=None,
    )
    assert "--no-perf" in check_command(spec, tmp_path, tmp_path / "o")
    cmd = check_command(BisectSpec(**{**spec.__dict__, "perf": True}), tmp_path, tmp_path / "o")
    assert (
        "--perf" in cmd
        and cmd[cmd.index("--only") + 1] == "^(?:x)$"
        and cmd[cmd.index("--baseline") + 1] == "/w/b.json"
    )


def test_the_report_names_the_first_bad_commit_or_the_flaky_case():
    spec = BisectSpec(
        repo="/r",
        good="a" * 40,
        bad="b" * 40,
        cases=("x",),
        only="^(?:x)$",
        kernel="k",
        suite="s",
        device="cpu",
        config="/w/judge/pyproject.toml",
        baseline="/w/judge/baselines/cpu/k-s.json",
        setup=None,
    )
    first = StepResult("c" * 40, "plant", BAD, "x (dk)", {"x": ["dk"]})
    text = BisectOutcome(spec, (first,), first).text()
    assert f"FIRST BAD COMMIT: {'c' * 40} plant" in text and "x: dk" in text and "baselines/cpu/k-s.json" in text
    # many failing cases: what failed in how many, the first 20 by id, then how many more
    many = {f"c{i:02d}": ["dk"] + (["dq"] if i < 3 else []) for i in range(68)}
    wide = StepResult("c" * 40, "plant", BAD, "", many)
    lines = BisectOutcome(spec, (wide,), wide).text().splitlines()
    at = lines.index(f"FIRST BAD COMMIT: {'c' * 40} plant")
    assert lines[at + 1] == "  68 cases fail at it: dk in 68, dq in 3"
    assert lines[at + 2 : at + 22] == [f"  c{i:02d}: dk" + (", dq" if i < 3 else "") for i in range(20)]
    assert lines[at + 22 :] == ["  ... and 48 more: every one is in the bisect JSON"]
    flaky = StepResult("d" * 40, "f", FLAKY, "x flipped", {}, ("x",))
    out = BisectOutcome(spec, (flaky,), None, stopped=flaky)
    assert out.exit_code == 1 and "STOPPED: flaky" in out.text() and "x flipped on a re-run" in out.text()
    assert "FIRST BAD" not in out.text()


# ---------------------------------------------------------------- the synthetic repository


BASELINE = Path("baselines/cpu/tinyk_flash_attn_func-mini.json")


@functools.cache
def measured_baseline() -> str:
    """`attn-gate baseline update` of TINY_ATTN under PYPROJECT, in a fresh git repository as
    make_repo's commit 1 holds them. Every repository here (and test_rehearsal.py's bisect) starts
    from that same kernel and config, so one measurement serves them all: once per process, or once
    per SHARED_DIR (the pytest runs of one scripts/test.sh share it)."""
    if os.environ.get(SHARED_DIR):
        shared = Path(os.environ[SHARED_DIR])
    else:
        shared = Path(tempfile.mkdtemp(prefix="tinyk-baseline-"))
        atexit.register(shutil.rmtree, shared, True)

    def measure(root: Path) -> None:
        (root / "tinyk").mkdir()
        (root / "tinyk" / "__init__.py").write_text(TINY_ATTN)
        (root / "pyproject.toml").write_text(PYPROJECT)
        git(root, "init", "-q")
        assert gate(["baseline", "update", "--device", "cpu", "--no-progress"], root) == 0

    return (made_once(shared / "tinyk-baseline", measure) / BASELINE).read_text()


def make_repo(
    tmp_path: Path, edits: dict[int, "callable"], commits: int, files: dict[str, str] | None = None
) -> tuple[Path, list[str]]:
    """`commits` commits; commit 1 holds the kernel, the config and the baseline measured from them
    (measured_baseline); `edits[i](text) -> text` changes the kernel in commit i. Returns the repo
    and its commits."""
    repo = tmp_path / "kernels"
    (repo / "tinyk").mkdir(parents=True)
    (repo / "tinyk" / "__init__.py").write_text(TINY_ATTN)
    (repo / "pyproject.toml").write_text(PYPROJECT)
    (repo / ".gitignore").write_text("out/\n__pycache__/\n")
    for rel, text in (files or {}).items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "init", "-q")
    (repo / BASELINE).parent.mkdir(parents=True)
    (repo / BASELINE).write_text(measured_baseline())
    ids = []
    for i in range(1, commits + 1):
        if i in edits:
            path = repo / "tinyk" / "__init__.py"
            path.write_text(edits[i](path.read_text()))
        (repo / "NOTES.md").write_text(f"commit {i}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"commit {i}")
        ids.append(git(repo, "rev-parse", "HEAD"))
    return repo, ids


def fail_at_head(repo: Path) -> None:
    """The nightly's check that fails and leaves its findings in out/ for --last-failed. In this
    process: no warm worker here holds an earlier kernel of REPO (measured_baseline measures in a
    folder of its own, and a user kernel's workers are kept per working directory)."""
    assert gate(["check", "--device", "cpu", "--no-progress"], repo) == 1


def bisect(repo: Path, capfd: pytest.CaptureFixture, *args: str) -> subprocess.CompletedProcess:
    """`attn-gate bisect ARGS` from REPO in this process, with what it wrote to stdout and stderr."""
    capfd.readouterr()
    code = gate(["bisect", *args], repo)
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["bisect", *args], code, out, err)


def plant(text: str) -> str:
    return text.replace(DK_LINE, PLANTED)


def no_leftovers(repo: Path) -> None:
    assert git(repo, "worktree", "list").count("\n") == 0  # the bisect's worktrees are gone
    assert not (Path(git(repo, "rev-parse", "--git-dir")) / "BISECT_LOG").exists()


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Commit 3 does not build (a syntax error, fixed in 4), commit 5 plants dK x1.02; the nightly's
    check has failed at the head. git bisect from commit 1 visits 3, 4 and 5, in that order."""
    repo, commits = make_repo(
        tmp_path_factory.mktemp("planted"),
        {3: lambda t: t + "\ndef broken(:\n", 4: lambda t: t.replace("\ndef broken(:\n", ""), 5: plant},
        commits=6,
    )
    fail_at_head(repo)
    return repo, commits


@pytest.mark.slow
@pytest.mark.xdist_group("bisect")
def test_bisect_names_the_commit_that_planted_the_bug_and_skips_one_that_does_not_build(planted, capfd, monkeypatch):
    repo, commits = planted
    monkeypatch.setenv("COLUMNS", "80")  # every line wraps at words to the terminal
    # one run a step: the re-runs are the flaky test's business
    proc = bisect(repo, capfd, "--good", commits[0], "--last-failed", "--reruns", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"FIRST BAD COMMIT: {commits[4]} commit 5" in proc.stdout
    for case in CASES:
        assert f"  {case}: dk" in proc.stdout
    assert f"{commits[2][:12]} skip" in proc.stdout and "py_compile" in proc.stdout  # the install step failed
    assert f"attn-gate bisect: {commits[2][:12]} skip" in proc.stderr  # each step's verdict is shown as it comes
    long = [line for line in (proc.stdout + proc.stderr).splitlines() if len(line) > 80 and " " in line.strip()]
    assert not long, long
    data = json.loads((repo / "out" / "bisect-tinyk_flash_attn_func-mini.json").read_text())
    assert data["first_bad"]["commit"] == commits[4] and data["first_bad"]["failing"] == {c: ["dk"] for c in CASES}
    no_leftovers(repo)


@pytest.mark.slow
@pytest.mark.xdist_group("bisect")
def test_bisect_refuses_a_good_end_that_fails(planted, capfd):
    repo, commits = planted
    proc = bisect(repo, capfd, "--good", commits[4], "--last-failed", "--reruns", "0")
    assert proc.returncode == 2 and "--good" in proc.stderr and "is bad, not good" in proc.stderr
    no_leftovers(repo)


@pytest.mark.slow
@pytest.mark.xdist_group("bisect")
def test_an_install_step_that_fails_at_the_bad_end_names_its_cause_and_setup_none(planted, capfd, monkeypatch):
    repo, commits = planted
    failing = 'echo "ERROR: No matching distribution found for kern" >&2; echo "note: names no cause" >&2; exit 1'
    proc = bisect(repo, capfd, "--good", commits[0], "--last-failed", "--setup", failing)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("attn-gate: error: --bad") and "is skip, not bad" in error, error
    said = error.split("failed (exit 1): ", 1)[1]  # after the quoted command: what it said
    assert said.startswith("ERROR: No matching distribution found for kern") and "names no cause" not in said
    assert proc.stderr.count("is skip") == 1, proc.stderr  # said once, in the error line
    assert "--setup none" in error and "pass the commit where these cases fail" not in error
    no_leftovers(repo)
    # `--setup none` installs nothing, as its help says (a command named `none` is never run)
    from gate.commands import bisect as command

    seen = []

    def stop(spec, log=print):
        seen.append(spec.setup)
        raise UserError("stopped")

    monkeypatch.setattr(command, "run_bisect", stop)
    assert bisect(repo, capfd, "--good", commits[0], "--last-failed", "--setup", "none").returncode == 2
    assert seen == [""]


@pytest.mark.slow
def test_bisect_stops_on_a_flaky_kernel_and_names_the_case(tmp_path, capfd):
    repo, commits = make_repo(
        tmp_path,
        {
            2: lambda t: t.replace("\nimport torch\n", "\nimport torch\n" + FLAKY_KERNEL, 1).replace(
                DK_LINE, DK_LINE + "        dk = dk * 1.02 if _FLAKY else dk\n"
            )
        },
        commits=3,
    )
    # the bad end's check (the first import: the bug is on), then its re-run (off)
    proc = bisect(repo, capfd, "--good", commits[0], "--only", exact_regex(CASES))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "STOPPED: flaky" in proc.stdout and "FIRST BAD" not in proc.stdout
    assert all(case in proc.stdout.split("STOPPED")[1] for case in CASES)
    no_leftovers(repo)


def test_bisect_usage_errors_are_one_line(tmp_path, monkeypatch, capsys):
    from gate.commands.main import main

    monkeypatch.chdir(tmp_path)
    assert main(["bisect", "--good", "HEAD~1"]) == 2
    assert "--only REGEX, or --last-failed" in capsys.readouterr().err
    assert main(["bisect", "--good", "HEAD~1", "--only", "x"]) == 2
    assert "not inside a git repository" in capsys.readouterr().err
    git(tmp_path, "init", "-q")
    (tmp_path / "f").write_text("1")
    git(tmp_path, "add", "f")
    git(tmp_path, "commit", "-q", "-m", "one")
    assert main(["bisect", "--good", "nope", "--only", "x"]) == 2
    assert "--good nope: not a commit" in capsys.readouterr().err
    assert main(["bisect", "--good", "HEAD", "--only", "x"]) == 2
    assert "not an older ancestor" in capsys.readouterr().err
    # --last-failed after a check where nothing failed: a bisect needs a failing case
    from gate.commands.check import last_failed_ids
    from gate.core.errors import UserError

    passing = {"schema_version": 2, "kind": "attn-gate findings", "verdict": "PASS", "context": {}, "findings": []}
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "findings-k-s.json").write_text(json.dumps(passing))
    with pytest.raises(UserError, match=r"no case failed in the last check in .*out \(findings-k-s\.json\); nothing"):
        last_failed_ids(tmp_path / "out", None, None)


def test_an_interrupted_bisect_leaves_no_worktree_and_no_bisect_state(tmp_path):
    from gate.workflow.bisect import bisect_workdir, worktree

    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q")
    for i in range(3):
        (repo / "f").write_text(str(i))
        git(repo, "add", "f")
        git(repo, "commit", "-q", "-m", f"c{i}")
    with pytest.raises(KeyboardInterrupt):
        with bisect_workdir(str(repo)) as work:
            with worktree(str(repo), work / "bisect", "HEAD", checkout=False):
                git(work / "bisect", "bisect", "start", "--no-checkout", "HEAD", "HEAD~2")
                (work / "step").mkdir()
                git(repo, "worktree", "add", "-q", "--detach", str(work / "step" / "x"), "HEAD~1")  # a step cut short
                raise KeyboardInterrupt
    assert not work.exists()
    no_leftovers(repo)
