"""Every class of the bad-input corpus (tests/bad_inputs.py) is refused: exit 2, one line that names
the file and the field or key, no traceback, nothing written where it was refused."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from gate.commands.main import main
from gate.compare.baselines import Baseline, diff_baselines, read_baseline
from gate.core.errors import UserError
from gate.workflow.journal import Journal, read_journal
from tests.bad_inputs import CLASSES, SUITE, Project, config_text

# its tests share one module-scoped run: one worker makes it (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("bad_inputs")


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Project:
    """A tiny suite swept for real (in process), and the baseline made from that results file."""
    root = tmp_path_factory.mktemp("good")
    config = root / "pyproject.toml"
    config.write_text(config_text(root / "baselines"))
    run = [
        "sweep",
        "--config",
        str(config),
        "--suite",
        SUITE,
        "--kernel",
        "sdpa-cpu",
        "--device",
        "cpu",
        "--out",
        str(root / "run"),
        "--no-progress",
        "--workers",
        "0",
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("GITHUB_STEP_SUMMARY", raising=False)
        assert main(run) == 0
        (results,) = (root / "run").glob("sweep-*.json")
        assert main(["baseline", "update", "--config", str(config), "--from-results", str(results)]) == 0
    (baseline,) = (root / "baselines").rglob("*.json")
    return Project(root, config, results, baseline)


@pytest.fixture
def project(good, tmp_path, monkeypatch) -> Project:
    """A private copy of the good project (an update must not touch the shared baseline)."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    shutil.copytree(good.root / "baselines", tmp_path / "baselines")
    config = tmp_path / "pyproject.toml"
    config.write_text(config_text(tmp_path / "baselines"))
    results = tmp_path / good.results.name
    shutil.copy(good.results, results)
    (baseline,) = (tmp_path / "baselines").rglob("*.json")
    return Project(tmp_path, config, results, baseline)


def test_the_good_project_passes(project):
    assert main(project.check(project.results)) == 0
    assert json.loads(project.results.read_text())["cases"][0]["checks"][0]["passed"] is True


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_each_bad_input_class_is_refused_naming_file_and_field(name, project, capsys):
    before = project.baseline.read_bytes()
    command, words = CLASSES[name](project)
    capsys.readouterr()
    assert main(command) == 2, name
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, (word, err)
    bad_file = next((arg for arg in command if arg.endswith(".json") or arg.endswith(".toml")), None)
    assert bad_file is None or bad_file in err or "--config" in command, err
    assert project.baseline.read_bytes() == before  # a refused update never rewrites the baseline
    assert not (project.root / "out-bad" / "findings-sdpa-cpu-tiny.json").exists()


def test_a_journal_row_that_contradicts_itself_is_refused_on_resume(project):
    data = project.results_json()
    row = data["cases"][0]
    tensor = next(iter(row["tensors"].values()))
    tensor["max_err"], tensor["ratio"] = 50 * tensor["bound"], 50.0  # a PASS row at ratio 50
    header = {"kernel": data["kernel"]}
    journal = Journal(project.root / "journal.jsonl")
    journal.start(header, resume=False)
    with open(journal.path, "a") as fh:
        fh.write(json.dumps(row) + "\n")
    with pytest.raises(UserError, match=r"line 2 is damaged \(ValueError: case .*status PASS contradicts"):
        read_journal(journal.path, header)


def test_a_deeply_nested_journal_line_is_a_user_error(project):
    header = {"kernel": "k"}
    journal = Journal(project.root / "journal.jsonl")
    journal.start(header, resume=False)
    with open(journal.path, "a") as fh:
        fh.write("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(UserError, match="line 2 is damaged"):
        read_journal(journal.path, header)


def test_a_baseline_with_a_pass_row_over_its_bound_is_refused(project, capsys):
    data = json.loads(project.baseline.read_text())
    row = next(iter(data["correctness"].values()))
    tensor = next(iter(row["tensors"].values()))
    tensor["max_err"], tensor["ratio"] = 5 * tensor["bound"], 5.0
    project.baseline.write_text(json.dumps(data))
    assert main(project.check(project.results)) == 2
    err = capsys.readouterr().err
    assert str(project.baseline) in err and "status PASS contradicts" in err


def test_the_update_summary_lists_dropped_tensors(project):
    old = read_baseline(project.baseline)
    cid, row = next(iter(old.correctness.items()))
    lost = sorted(row.tensors)[-1]
    cut = {
        **old.correctness,
        cid: type(row)(row.status, row.reason, {k: v for k, v in row.tensors.items() if k != lost}),
    }
    new = Baseline(**{**old.__dict__, "correctness": cut})
    diff = diff_baselines(old, new, project.baseline, 1.5, 0.05, 4.0)
    assert diff.dropped == ((cid, lost),)
    assert "1 tensors dropped" in diff.markdown() and f"`{cid}` {lost}" in diff.markdown()


UNWRITABLE = "/proc/attn-gate-unwritable"  # root may write almost anywhere, never a new entry under /proc
OUT_COMMANDS = {
    "sweep": ["sweep", "--kernel", "sdpa-cpu", "--device", "cpu", "--no-progress"],
    "check": ["check", "--kernel", "sdpa-cpu", "--device", "cpu", "--no-progress"],
    "baseline update": ["baseline", "update", "--kernel", "sdpa-cpu", "--device", "cpu", "--no-progress"],
    "merge": ["merge"],
    "selftest": ["selftest", "--kernel", "sdpa-cpu", "--device", "cpu"],
}


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
@pytest.mark.parametrize("name", sorted(OUT_COMMANDS))
def test_an_unwritable_out_is_one_line_and_exit_2_before_any_case(name, project, capsys):
    """The default workers, a real suite: refused before a worker starts or a case runs."""
    command = OUT_COMMANDS[name] + ["--config", str(project.config), "--out", UNWRITABLE]
    if name == "merge":
        command.append(str(project.root))
    elif name != "selftest":
        command += ["--suite", SUITE]
    started = time.monotonic()
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"--out {UNWRITABLE}" in err and "pass a writable folder" in err, err
    assert time.monotonic() - started < 20
