"""Names and options are checked before anything runs: a typo is answered as a typo, with the
nearest known names and exit 2, in every command; "no baseline" is said only for a valid kernel and
suite, with a command that works; `--device cuda` without CUDA is one line and exit 2."""

from __future__ import annotations

import contextlib
import re
import shlex
from pathlib import Path

import pytest
import torch

from gate.commands.main import main
from gate.compare.admission import BASELINES_DOC

ROOT = Path(__file__).resolve().parent.parent


def run(argv, capsys, cwd=ROOT):
    with contextlib.chdir(cwd):
        rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("command", [["check"], ["sweep"], ["baseline", "update"], ["baseline", "show"], ["perf"]])
def test_kernel_typo_names_the_nearest_kernel_and_never_advises_a_baseline(command, capsys, tmp_path):
    rc, out, err = run([*command, "--kernel", "sdpa-cpuu", "--device", "cpu"], capsys)
    assert rc == 2
    assert "did you mean sdpa-cpu" in err
    assert "baseline update" not in err and "baseline update" not in out
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", [["check"], ["sweep"], ["baseline", "update"], ["perf"]])
def test_suite_typo_names_the_nearest_suite(command, capsys):
    rc, _, err = run([*command, "--suite", "smok", "--device", "cpu"], capsys)
    assert rc == 2
    assert "did you mean smoke" in err
    assert "baseline update" not in err


def test_a_known_name_passes_validation(capsys):
    from gate.core.config import load_config
    from gate.workflow.validate import validate_target

    with contextlib.chdir(ROOT):
        target = validate_target(load_config(), "sdpa-cpu", "smok".rstrip("k") + "ke", "cpu", "causal$")
    assert (target.kernel, target.suite, target.device) == ("sdpa-cpu", "smoke", "cpu")


@pytest.mark.slow
def test_a_user_kernel_that_does_not_import_is_a_usage_error(capsys):
    rc, _, err = run(["check", "--kernel", "tests.no_such_module:fn", "--device", "cpu"], capsys)
    assert rc == 2 and "does not import" in err and "baseline update" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", [["check"], ["sweep"], ["perf"], ["drift"], ["baseline", "update"]])
def test_device_cuda_without_cuda_is_one_line_and_exit_2(command, capsys):
    rc, _, err = run([*command, "--device", "cuda"], capsys)
    assert rc == 2
    assert err.strip().count("\n") == 0 and "no CUDA GPU" in err
    assert "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="fa2 might run on a GPU machine")
def test_a_gpu_kernel_on_cpu_is_a_usage_error_not_no_baseline(capsys):
    rc, _, err = run(["check", "--kernel", "fa2", "--device", "cpu"], capsys)
    assert rc == 2 and ("is unavailable here" in err or "runs on" in err)
    assert "baseline update" not in err


def test_missing_baseline_file_option_is_not_advised_to_be_committed(capsys):
    rc, _, err = run(["check", "--device", "cpu", "--baseline", "nope.json"], capsys)
    assert rc == 2 and "--baseline nope.json: no such file" in err
    assert "commit" not in err


def test_running_from_another_folder_says_where_to_run(capsys, tmp_path):
    rc, _, err = run(["check", "--device", "cpu"], capsys, cwd=tmp_path)
    assert rc == 2 and "repository's root" in err and "baseline update" not in err


@pytest.mark.slow
def test_no_baseline_for_a_valid_kernel_gives_a_command_that_works(capsys, tmp_path):
    """A valid kernel and suite without a baseline: the message names the command, and that
    command (run as printed, on the one case of the config's CPU suite) creates the baseline."""
    from tests.minisuite import suite

    (tmp_path / "baselines").mkdir()
    cfg = tmp_path / "pyproject.toml"
    cfg.write_text(
        '[tool.attn-gate]\nbaselines_dir = "baselines"\n[tool.attn-gate.cpu]\nsuite = "one"\n'
        + suite("one", causal=(True,))
    )
    rc, _, err = run(["check", "--device", "cpu", "--kernel", "sdpa-math", "--config", str(cfg)], capsys, cwd=tmp_path)
    assert rc == 2
    command = re.search(r"`(attn-gate baseline update[^`]*)`", err).group(1)
    assert "--suite one" in command  # the config's suite, not the default smoke
    assert f"{BASELINES_DOC[0]}, '{BASELINES_DOC[1]}'" in err
    argv = shlex.split(command)[1:] + ["--config", str(cfg), "--no-progress", "--out", str(tmp_path / "out")]
    rc, _, _ = run(argv, capsys, cwd=tmp_path)
    assert rc == 0 and (tmp_path / "baselines" / "cpu" / "sdpa-math-one.json").is_file()


def test_every_doc_section_a_message_points_to_exists():
    """A message that says "see docs/PAGE.md, 'Section'" names a page and a heading that exist."""
    referenced = {BASELINES_DOC}
    for path in (ROOT / "gate").rglob("*.py"):
        referenced |= set(re.findall(r"(docs/[\w/.-]+\.md), '([^'{]+)'", path.read_text()))
    missing = []
    for page, section in sorted(referenced):
        file = ROOT / page
        headings = (
            {line.lstrip("#").strip() for line in file.read_text().splitlines() if line.startswith("#")}
            if file.is_file()
            else set()
        )
        if section not in headings:
            missing.append((page, section))
    assert missing == []


def test_nearest_offers_nothing_for_a_name_far_from_all():
    from gate.workflow.validate import nearest

    assert nearest("sdpa-cpuu", ["sdpa-cpu", "flex"]) == " (did you mean sdpa-cpu?)"
    assert nearest("zzzzzz", ["sdpa-cpu", "flex"]) == ""


@pytest.mark.parametrize(
    "args, words",
    [
        (["--kernel", "sdpa-cpuu"], "did you mean sdpa-cpu"),
        (["--suite", "smok"], "did you mean smoke"),
        (["--anchor", "sdpa-mat"], "did you mean sdpa-math"),
    ],
)
def test_bench_checks_names_before_asv_runs(args, words, capsys):
    """Also: the default asv.conf.json is the repository's (it was looked for under gate/)."""
    rc, _, err = run(["bench", "--device", "cpu", *args], capsys)
    assert rc == 2 and words in err and "asv.conf.json" not in err
