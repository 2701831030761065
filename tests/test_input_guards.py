"""bad-input classes, one rule each: refused with exit 2 and a one-line message naming the
file or option, nothing written; and the same command passing on the good input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gate.commands.main import main
from gate.core.cases import MAX_SUITE_CASES, expand_suite
from gate.core.config import Config, load_config
from gate.core.errors import UserError
from gate.core.files import FolderLock
from gate.workflow.sweep import run_sweep

SUITE = (
    "[tool.attn-gate.suites.g]\nseeds = [0]\n[[tool.attn-gate.suites.g.matrix]]\n"
    'dtype = ["fp32"]\nbatch = [1]\nseqlens = ["8", "9"]\nheads = ["2"]\nhead_dims = ["8"]\n'
)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder with a config, a results file of a sdpa-cpu run and its baseline; cwd elsewhere."""
    import tomllib

    proj = tmp_path / "proj"
    proj.mkdir()
    config = proj / "pyproject.toml"
    config.write_text(f'[tool.attn-gate]\nbaselines_dir = "baselines"\n{SUITE}')
    suites = tomllib.loads(SUITE)["tool"]["attn-gate"]["suites"]
    results = proj / "results.json"
    run_sweep("sdpa-cpu", "g", Config(suites=suites, source=str(config)), "cpu", progress=False).write(results)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # --config from another folder: baselines_dir is the config's, not the cwd's
    assert main(["baseline", "update", "--from-results", str(results), "--config", str(config)]) == 0
    assert (proj / "baselines" / "cpu" / "sdpa-cpu-g.json").is_file() and not (elsewhere / "baselines").exists()
    return proj, config, results, proj / "baselines" / "cpu" / "sdpa-cpu-g.json"


def refused(args, capsys, words) -> None:
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_the_good_inputs_pass(project):
    proj, config, results, _ = project
    assert main(["check", "--results", str(results), "--config", str(config), "--out", str(proj / "out")]) == 0


@pytest.mark.parametrize("value", ["nan", "inf", -0.5])
def test_a_non_finite_or_negative_ratio_in_a_baseline_is_refused(project, capsys, value):
    proj, config, results, baseline = project
    edit(baseline, lambda d: d["correctness"]["fp32-b1-h2-s8-d8"]["tensors"]["out"].update(ratio=value))
    refused(["check", "--results", str(results), "--config", str(config), "--out", str(proj / "out")], capsys, "ratio")
    assert not (proj / "out").exists()


@pytest.mark.parametrize("value", ["nan", "-inf", -1.0])
def test_baseline_update_never_writes_a_nan_ratio(project, capsys, value):
    proj, config, results, baseline = project
    before = baseline.read_bytes()
    edit(results, lambda d: d["cases"][0]["tensors"]["dq"].update(ratio=value))
    refused(["baseline", "update", "--from-results", str(results), "--config", str(config)], capsys, "dq.ratio")
    assert baseline.read_bytes() == before


def _infinite_error(status):
    def change(d):
        row = d["cases"][0]
        row["status"], row["reason"] = status, "lse over the bound"
        row["tensors"]["lse"].update(max_err="inf", mean_err="inf", ratio="inf", mean_ratio="inf")

    return change


def test_an_infinite_error_is_a_fail_row_that_reads_back(project, capsys):
    """A kernel's LSE of inf (FA2's window -1 class) is an infinite error: the FAIL row reads
    back (check fails it, exit 1; a baseline keeps it) instead of losing the run."""
    proj, config, results, baseline = project
    edit(results, _infinite_error("FAIL"))
    assert main(["check", "--results", str(results), "--config", str(config), "--out", str(proj / "out")]) == 1
    assert "fp32-b1-h2-s8-d8" in (proj / "out" / "check-sdpa-cpu-g.md").read_text()


def test_an_infinite_error_on_a_pass_row_is_refused(project, capsys):
    proj, config, results, _ = project
    edit(results, _infinite_error("PASS"))
    refused(
        ["check", "--results", str(results), "--config", str(config), "--out", str(proj / "out")],
        capsys,
        "status PASS contradicts",
    )


def test_a_baseline_keeps_an_infinite_error_on_a_failing_row_only(project, capsys):
    """A baseline row of a declared failure may hold an infinite (or huge) error: it reads back;
    the same numbers on a PASS row are refused, as is an inf ratio whose error is finite."""
    from gate.compare.baselines import CaseBaseline

    proj, config, results, baseline = project
    row = json.loads(baseline.read_text())["correctness"]["fp32-b1-h2-s8-d8"]
    row["tensors"]["out"].update(max_err="inf", mean_err="inf", ratio="inf")
    row.update(status="FAIL", reason="out over the bound")
    failing = CaseBaseline.from_dict(json.loads(json.dumps(row)))
    assert failing.tensors["out"].ratio == math.inf
    huge = dict(
        row,
        tensors={
            **row["tensors"],
            "out": dict(
                row["tensors"]["out"], max_err=1.6e6 * row["tensors"]["out"]["bound"], mean_err=1.0, ratio=1.6e6
            ),
        },
    )
    assert CaseBaseline.from_dict(huge).tensors["out"].ratio == 1.6e6
    with pytest.raises(ValueError, match="status PASS contradicts"):
        CaseBaseline.from_dict(dict(row, status="PASS"))
    forged = dict(row, tensors={**row["tensors"], "out": dict(row["tensors"]["out"], max_err=0.0, mean_err=0.0)})
    with pytest.raises(ValueError, match="ratio"):
        CaseBaseline.from_dict(forged)


def test_a_nan_error_in_a_results_file_is_refused(project, capsys):
    """The writer stores a NaN as inf: a NaN read back is a forged or damaged file."""
    proj, config, results, _ = project
    edit(results, lambda d: d["cases"][0]["tensors"]["lse"].update(max_err="nan"))
    refused(
        ["check", "--results", str(results), "--config", str(config), "--out", str(proj / "out")], capsys, "lse.max_err"
    )


def test_a_path_in_gpu_class_or_suite_is_refused(project, capsys, tmp_path):
    proj, config, results, _ = project
    edit(results, lambda d: d["environment"].update(gpu_class="../../x"))
    refused(["baseline", "update", "--from-results", str(results), "--config", str(config)], capsys, "gpu_class")
    assert not (tmp_path / "x").exists() and sorted(p.name for p in (proj / "baselines").iterdir()) == ["cpu"]


def test_a_key_twice_in_a_json_file_is_refused(project, capsys):
    proj, config, results, baseline = project
    baseline.write_text(baseline.read_text().replace('"suite":', '"suite": "g", "suite":', 1))
    refused(["check", "--results", str(results), "--config", str(config), "--out", str(proj / "out")], capsys, "twice")


def test_a_baseline_that_lost_cases_is_refused(project, capsys):
    proj, config, results, baseline = project
    edit(baseline, lambda d: d["correctness"].pop("fp32-b1-h2-s9-d8"))
    refused(
        ["check", "--results", str(results), "--config", str(config), "--out", str(proj / "out")],
        capsys,
        "lacks 1 of the 2 cases",
    )
    edit(baseline, lambda d: d.update(correctness={}))
    refused(
        ["check", "--results", str(results), "--config", str(config), "--out", str(proj / "out")],
        capsys,
        "lacks 2 of the 2 cases",
    )


def test_out_inside_the_baselines_folder_is_refused(project, capsys):
    proj, config, results, _ = project
    refused(
        ["check", "--results", str(results), "--config", str(config), "--out", str(proj / "baselines" / "cpu")],
        capsys,
        "inside the baselines folder",
    )
    refused(
        [
            "sweep",
            "--kernel",
            "sdpa-cpu",
            "--suite",
            "g",
            "--config",
            str(config),
            "--device",
            "cpu",
            "--out",
            str(proj / "baselines"),
        ],
        capsys,
        "inside the baselines folder",
    )
    assert sorted(p.name for p in (proj / "baselines" / "cpu").iterdir()) == ["sdpa-cpu-g.json"]


def test_a_second_baseline_update_at_once_is_refused(project, capsys):
    proj, config, results, baseline = project
    before = baseline.read_bytes()
    with FolderLock(proj / "baselines"):
        refused(
            ["baseline", "update", "--from-results", str(results), "--config", str(config)],
            capsys,
            "another attn-gate run is writing there",
        )
    assert baseline.read_bytes() == before
    assert main(["baseline", "update", "--from-results", str(results), "--config", str(config)]) == 0


def test_a_suite_above_the_cap_is_refused_before_it_is_expanded():
    block = {"batch": list(range(1, 401)), "seqlens": [str(n) for n in range(1, 401)], "heads": ["1", "2", "4"]}
    with pytest.raises(UserError, match=f"480000 cases, more than the cap of {MAX_SUITE_CASES}"):
        expand_suite("huge", {"seeds": [0], "matrix": [block]}, "pyproject.toml")
    assert len(expand_suite("ok", {"seeds": [0], "matrix": [{"batch": [1, 2], "seqlens": ["8", "9"]}]}, "x").cases) == 4


def test_config_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    (tmp_path / "p").mkdir()
    cfg = tmp_path / "p" / "pyproject.toml"
    cfg.write_text('[tool.attn-gate]\nbaselines_dir = "b"\n')
    monkeypatch.chdir(tmp_path)
    assert Path(load_config(cfg).baselines_dir) == tmp_path / "p" / "b"
    cfg.write_text(f'[tool.attn-gate]\nbaselines_dir = "{tmp_path / "abs"}"\n')
    assert Path(load_config(cfg).baselines_dir) == tmp_path / "abs"
    assert load_config(None).baselines_dir == "baselines"  # ./pyproject.toml absent: the defaults, as before


@pytest.mark.parametrize(
    "flag,value,words",
    [
        ("--workers", "-1", "--workers"),
        ("--case-timeout", "0", "--case-timeout"),
        ("--case-timeout", "nan", "--case-timeout"),
        ("--shard", "3/2", "--shard"),
    ],
)
def test_run_options_out_of_range_are_usage_errors(project, capsys, flag, value, words):
    proj, config, _, _ = project
    refused(
        [
            "sweep",
            "--kernel",
            "sdpa-cpu",
            "--suite",
            "g",
            "--config",
            str(config),
            "--device",
            "cpu",
            "--out",
            str(proj / "o"),
            flag,
            value,
        ],
        capsys,
        words,
    )
    assert not (proj / "o").exists()


def test_check_refuses_to_run_the_kernel_in_the_deciding_process(project, capsys):
    proj, config, _, _ = project
    refused(
        [
            "check",
            "--kernel",
            "sdpa-cpu",
            "--suite",
            "g",
            "--config",
            str(config),
            "--device",
            "cpu",
            "--out",
            str(proj / "o"),
            "--workers",
            "0",
        ],
        capsys,
        "--workers 0",
    )
    assert not (proj / "o").exists()


def test_a_summary_path_that_is_a_fifo_is_refused_and_left_alone(project, capsys):
    import os
    import stat

    proj, config, results, baseline = project
    fifo = proj / "fifo"
    os.mkfifo(fifo)
    refused(
        ["baseline", "update", "--from-results", str(results), "--config", str(config), "--summary", str(fifo)],
        capsys,
        "not a regular file",
    )
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert (
        main(
            [
                "baseline",
                "update",
                "--from-results",
                str(results),
                "--config",
                str(config),
                "--summary",
                str(proj / "summary.md"),
            ]
        )
        == 0
    )


def test_an_unwritable_step_summary_does_not_turn_a_pass_into_an_error(project, capsys, monkeypatch):
    proj, config, results, _ = project
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(proj))  # a folder: cannot be opened for appending
    assert main(["check", "--results", str(results), "--config", str(config), "--out", str(proj / "out")]) == 0
    assert "GITHUB_STEP_SUMMARY" in capsys.readouterr().err


def test_an_all_skip_baseline_is_refused(project, capsys):
    proj, config, results, baseline = project

    def all_skip(d):
        for c in d["correctness"].values():
            c.update(status="SKIP", tensors={})

    edit(baseline, all_skip)
    refused(
        ["check", "--results", str(results), "--config", str(config), "--out", str(proj / "out")],
        capsys,
        "every case of the baseline is SKIP",
    )


@pytest.mark.parametrize(
    "line,words",
    [("softcap = [nan]", "softcap must be a finite number"), ("softcap = [inf]", "softcap must be a finite number")],
)
def test_a_non_finite_softcap_is_refused(tmp_path, line, words):
    cfg = tmp_path / "pyproject.toml"
    cfg.write_text(SUITE + line + "\n")
    with pytest.raises(UserError, match=words):
        load_config(cfg)


@pytest.mark.parametrize("seeds", ["[-1]", "[4294967296]", "[true]"])
def test_out_of_range_seeds_are_refused(tmp_path, seeds):
    cfg = tmp_path / "pyproject.toml"
    cfg.write_text(SUITE.replace("seeds = [0]", f"seeds = {seeds}"))
    with pytest.raises(UserError, match="seeds must be"):
        load_config(cfg)
