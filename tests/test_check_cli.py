"""`attn-gate check` and `attn-gate baseline` end to end, in process (no torch start-up per call).

One test runs the main job (sdpa-cpu on smoke against the committed baselines/cpu/, as CI's gate
does); the others judge crafted copies of the sweep this test session recorded its CPU baseline
from (conftest.py `cpu_baseline`) against that baseline, so they pass on any machine, or run a
few cases (--only).
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from gate.commands.main import build_parser, main
from gate.compare.baselines import read_baseline
from gate.core.cases import load_suite

ROOT = Path(__file__).resolve().parent.parent
# a well-formed baseline file, for the refusals that come before anything is compared
CPU_BASELINE = ROOT / "baselines" / "cpu" / "sdpa-cpu-smoke.json"
SMOKE_CASES = len(load_suite("smoke").cases)  # other issues add cases to smoke: counted, not hard-coded
SQUARE_NON_GQA = "^(bf16|fp16)-b2-h4-s128-d64"  # SDPA's top-left causal equals flash-attn's here


def sdpa_with_lse(q, k, v, softmax_scale=None, causal=False, return_attn_probs=False):
    """tests.verdict_kernels:sdpa_ok that also returns its LSE, as flash_attn_func does with
    return_attn_probs=True (`--kernel tests.test_check_cli:sdpa_with_lse`)."""
    import torch

    from tests.verdict_kernels import sdpa_ok

    out = sdpa_ok(q, k, v, softmax_scale=softmax_scale, causal=causal)
    if not return_attn_probs:
        return out
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    with torch.no_grad():
        scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
        if causal:  # square cases only (SQUARE_NON_GQA): top-left equals bottom-right
            scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
    return out, lse, None


@pytest.fixture(scope="module")
def full_check(tmp_path_factory):
    """`attn-gate check` exactly as scripts/gate.sh runs it on a CPU-only machine."""
    out = tmp_path_factory.mktemp("check")
    with pytest.MonkeyPatch.context() as mp, contextlib.chdir(ROOT):
        mp.delenv("GITHUB_STEP_SUMMARY", raising=False)
        rc = main(["check", "--device", "cpu", "--no-progress", "--out", str(out)])
    return rc, out


@pytest.fixture
def results(cpu_baseline, tmp_path) -> Path:
    """A private copy of the sweep this machine's CPU baseline was made from, to craft variants of."""
    path = tmp_path / "sweep.json"
    shutil.copy(cpu_baseline.sweep, path)
    return path


@pytest.fixture
def project(tmp_path) -> tuple[Path, Path]:
    """A scratch project: its own pyproject.toml with baselines_dir in tmp (the repo's stays untouched)."""
    baselines = tmp_path / "baselines"
    cfg = tmp_path / "pyproject.toml"
    cfg.write_text(f'[tool.attn-gate]\nbaselines_dir = "{baselines.as_posix()}"\n')
    return cfg, baselines


@pytest.fixture(autouse=True)
def no_step_summary(monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


def judge(cpu_baseline, results: Path, out: Path) -> int:
    """`attn-gate check --results` against the CPU baseline this test session recorded."""
    return main(["check", "--baseline", str(cpu_baseline.path), "--results", str(results), "--out", str(out)])


def findings_of(out: Path, stem: str = "sdpa-cpu-smoke") -> dict:
    return json.loads((out / f"findings-{stem}.json").read_text())


def edit_results(path: Path, edit) -> Path:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return path


def set_ratio(tensor: dict, ratio: float) -> None:
    """A crafted ratio with the error it comes from: a reader recomputes max_err / bound."""
    tensor["ratio"], tensor["max_err"] = ratio, ratio * tensor["bound"]


def case_of(data: dict, case_id: str) -> dict:
    return next(c for c in data["cases"] if c["case_id"] == case_id)


# ---------------------------------------------------------------- the main job


@pytest.mark.slow
@pytest.mark.ci_machine
def test_check_passes_against_committed_cpu_baseline(full_check):
    """The one test bound to CI's machines: the committed CPU baseline, as scripts/gate.sh checks it."""
    rc, out = full_check
    assert rc == 0
    data = findings_of(out)
    assert data["schema_version"] == 3 and data["verdict"] == "PASS" and data["exit_code"] == 0
    committed = read_baseline(ROOT / "baselines" / "cpu" / "sdpa-cpu-smoke.json")
    ctx = data["context"]  # the run's key, the committed baseline's: the check judged only a comparable one
    assert (ctx["suite_hash"], ctx["tolerance"], ctx["gpu_class"]) == (
        committed.suite_hash,
        committed.tolerance,
        committed.gpu_class,
    )
    assert data["counts"]["FAIL"] == 0 and data["counts"]["INCONCLUSIVE"] == 0 and data["counts"]["OK"] > 20
    assert data["thresholds"] == {
        "tolerance_ratio": 1.0,
        "headroom_factor": 1.5,
        "headroom_step": 0.1,
        "improvement_factor": 2.0,
    }
    summary = (out / "check-sdpa-cpu-smoke.md").read_text()
    assert summary.startswith("## attn-gate check: PASS\n\n> [!")  # the verdict line (GitHub alert syntax)
    assert "<details>" in summary and "headroom_step" in summary
    assert (out / "ratios-sdpa-cpu-smoke.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "sweep-sdpa-cpu-smoke.json").read_text())["kind"] == "attn-gate sweep"


@pytest.mark.slow
def test_check_exits_1_for_a_buggy_kernel_and_0_for_a_correct_one(cpu_baseline, in_repo_root, tmp_path, capsys):
    common = ["--baseline", str(cpu_baseline.path), "--only", SQUARE_NON_GQA, "--device", "cpu", "--no-progress"]
    assert (
        main(["check", "--kernel", "tests.verdict_kernels:scale_off_by_5pct", *common, "--out", str(tmp_path / "bad")])
        == 1
    )
    bad = findings_of(tmp_path / "bad", "tests.verdict_kernels_scale_off_by_5pct-smoke")
    assert {f["rule"] for f in bad["findings"] if f["severity"] == "FAIL"} >= {"tolerance", "status"}
    assert "FAIL: " in capsys.readouterr().out
    # the same SDPA call with the right scale, returning its LSE, passes against the same baseline
    assert (
        main(["check", "--kernel", "tests.test_check_cli:sdpa_with_lse", *common, "--out", str(tmp_path / "ok")]) == 0
    )
    ok = findings_of(tmp_path / "ok", "tests.test_check_cli_sdpa_with_lse-smoke")
    assert ok["verdict"] == "PASS" and {f["rule"] for f in ok["findings"] if f["severity"] == "WARN"} <= {
        "env_drift",
        "improvement",
    }
    # its exact float32 logsumexp beats the CPU kernel's approximate-exp LSE by far under the float32
    # LSE yardstick: an improvement WARN on lse, never on another tensor
    assert {f["metric"] for f in ok["findings"] if f["rule"] == "improvement"} <= {"ratio:lse"}
    # the same kernel without its LSE: the baseline validated lse, the run does not any more -> blocks
    assert main(["check", "--kernel", "tests.verdict_kernels:sdpa_ok", *common, "--out", str(tmp_path / "nolse")]) == 1
    nolse = findings_of(tmp_path / "nolse", "tests.verdict_kernels_sdpa_ok-smoke")
    blocking = {(f["rule"], f["metric"]) for f in nolse["findings"] if f["severity"] in ("FAIL", "INCONCLUSIVE")}
    assert blocking == {("tensor_dropped", "ratio:lse")}
    assert all(
        "accept it with `attn-gate baseline update --kernel tests.verdict_kernels:sdpa_ok --suite smoke --device cpu`"
        in f["message"]
        for f in nolse["findings"]
        if f["rule"] == "tensor_dropped"
    )


# ---------------------------------------------------------------- crafted results files


@pytest.mark.slow
def test_results_file_of_the_baseline_run_passes_and_crafted_bad_ones_fail(
    cpu_baseline, in_repo_root, results, tmp_path
):
    assert judge(cpu_baseline, results, tmp_path / "same") == 0

    def violate(data):
        c = case_of(data, "bf16-b2-h4-s128-d64")
        c["status"] = "FAIL"
        set_ratio(c["tensors"]["dk"], 1.3)

    assert judge(cpu_baseline, edit_results(results, violate), tmp_path / "v") == 1
    assert {(f["rule"], f["case_id"]) for f in findings_of(tmp_path / "v")["findings"] if f["severity"] == "FAIL"} == {
        ("tolerance", "bf16-b2-h4-s128-d64"),
        ("status", "bf16-b2-h4-s128-d64"),
    }


def test_headroom_regression_within_bound_fails(cpu_baseline, in_repo_root, results, tmp_path):
    def loosen(data):  # still within the bound, but 0.2-ish -> 0.9: the slow loosening
        set_ratio(case_of(data, "bf16-b2-h4-s128-d64")["tensors"]["dq"], 0.9)

    assert judge(cpu_baseline, edit_results(results, loosen), tmp_path) == 1
    fails = [f for f in findings_of(tmp_path)["findings"] if f["severity"] == "FAIL"]
    assert [(f["rule"], f["metric"], f["current"]) for f in fails] == [("headroom", "ratio:dq", 0.9)]


def test_step_summary_is_appended(cpu_baseline, in_repo_root, results, tmp_path, monkeypatch):
    summary = tmp_path / "step_summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert judge(cpu_baseline, results, tmp_path / "o") == 0
    text = summary.read_text()
    assert text.startswith("earlier step\n## attn-gate check: PASS")


def test_results_of_another_kernel_than_asked_is_a_usage_error(in_repo_root, results, tmp_path, capsys):
    assert main(["check", "--results", str(results), "--kernel", "tiled", "--out", str(tmp_path)]) == 2
    assert "--kernel tiled but" in capsys.readouterr().err


# ---------------------------------------------------------------- bad baselines: exit 2, nothing overwritten


def _corrupt(kind: str, text: str) -> str:
    if kind == "malformed":
        return text.replace('"status": "PASS"', '"status": PASS', 1)
    if kind == "truncated":
        return text[: len(text) // 3]
    if kind == "unknown schema":
        return re.sub(r'"schema_version": \d+', '"schema_version": 7', text, count=1)
    if kind == "other gpu class":  # a real h200 baseline: both the class and the fingerprint say so
        data = json.loads(text)
        data["gpu_class"] = data["environment"]["gpu_class"] = "h200"
        data["environment"]["gpu_name"] = "NVIDIA H200"
        return json.dumps(data, indent=1, sort_keys=True)
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind, words",
    [
        ("malformed", ["not valid JSON", "restore it from git or regenerate"]),
        ("truncated", ["not valid JSON", "truncated"]),
        ("unknown schema", ["schema_version 7", "regenerate"]),
        (
            "other gpu class",
            ["GPU class 'h200'", "on 'cpu'", "attn-gate baseline update --kernel sdpa-cpu --suite smoke --device cpu"],
        ),
    ],
)
def test_bad_baseline_exits_2_naming_file_and_fix_and_overwrites_nothing(
    project, results, tmp_path, capsys, kind, words
):
    cfg, baselines = project
    path = baselines / "cpu" / "sdpa-cpu-smoke.json"
    path.parent.mkdir(parents=True)
    path.write_text(_corrupt(kind, CPU_BASELINE.read_text()))
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    out = tmp_path / "out"
    assert main(["check", "--config", str(cfg), "--results", str(results), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attn-gate: error: {path}") and len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err, err
    assert not out.exists()  # refused before anything was written
    # baseline update does not overwrite an unreadable (or foreign) baseline either
    rc = main(["baseline", "update", "--config", str(cfg), "--from-results", str(results)])
    assert (rc, (path.read_bytes(), path.stat().st_mtime_ns)) == (2, before)
    assert str(path) in capsys.readouterr().err


def test_explicit_baseline_of_another_gpu_class_is_refused(project, results, tmp_path, capsys):
    other = tmp_path / "baselines" / "h200" / "sdpa-cpu-smoke.json"
    other.parent.mkdir(parents=True)
    other.write_text(_corrupt("other gpu class", CPU_BASELINE.read_text()))
    assert main(["check", "--config", str(project[0]), "--results", str(results), "--baseline", str(other)]) == 2
    assert "never compares across GPU classes" in capsys.readouterr().err


def test_malformed_results_file_exits_2(project, tmp_path, capsys):
    bad = tmp_path / "sweep.json"
    bad.write_text('{"schema_version": 1, "kind": "attn-gate sweep", "cases": [')
    assert main(["check", "--config", str(project[0]), "--results", str(bad)]) == 2
    assert str(bad) in capsys.readouterr().err


# ---------------------------------------------------------------- a new user, from the README


def test_first_run_explains_how_to_create_the_baseline_and_that_works(project, results, tmp_path, capsys):
    cfg, baselines = project
    out = tmp_path / "out"
    assert main(["check", "--config", str(cfg), "--device", "cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    expected = baselines / "cpu" / "sdpa-cpu-smoke.json"
    assert f"{expected} does not exist" in err and not out.exists()
    command = err.split("Create it with `")[1].split("`")[0]
    assert command == "attn-gate baseline update --kernel sdpa-cpu --suite smoke --device cpu"
    build_parser().parse_args(shlex.split(command)[1:])  # a real command line
    # follow it (from the saved run, to skip a second sweep) and the check passes
    summary = tmp_path / "pr-body.md"
    argv = [*shlex.split(command)[1:], "--config", str(cfg), "--from-results", str(results), "--summary", str(summary)]
    argv.remove("--device"), argv.remove("cpu")  # a results file knows its device
    assert main(argv) == 0 and expected.is_file()
    assert "Baseline created" in summary.read_text()
    assert main(["check", "--config", str(cfg), "--results", str(results), "--out", str(out)]) == 0


def test_update_records_a_failing_run_only_where_declared_known(project, results, tmp_path, capsys):
    cfg, baselines = project
    path = baselines / "cpu" / "sdpa-cpu-smoke.json"

    def violate(data):
        c = case_of(data, "fp16-b2-h4-s128-d64")
        c["status"], c["reason"] = "FAIL", "out error > bound"
        set_ratio(c["tensors"]["out"], 2.0)

    bad = edit_results(results, violate)
    assert main(["baseline", "update", "--config", str(cfg), "--from-results", str(bad)]) == 1
    err = capsys.readouterr().err
    assert (
        "refusing to write" in err and "FAIL fp16-b2-h4-s128-d64  out 2x its bound" in err and "known_failures" in err
    )
    assert not path.exists()
    # the old escape hatch is a usage error that says where to go instead
    assert main(["baseline", "update", "--config", str(cfg), "--from-results", str(bad), "--allow-failing"]) == 2
    assert "--allow-failing was removed" in capsys.readouterr().err
    declared = tmp_path / "declared.toml"
    declared.write_text(
        cfg.read_text() + '[[tool.attn-gate.known_failures]]\nkernel = "sdpa-cpu"\n'
        'cases = "^fp16-b2-h4-s128-d64$"\ntensors = ["out"]\nreason = "planted"\n'
        'link = "https://example.org/issue/1"\n'
    )
    assert main(["baseline", "update", "--config", str(declared), "--from-results", str(bad)]) == 0
    assert "fail their bounds" in capsys.readouterr().out
    assert main(["check", "--config", str(declared), "--results", str(bad), "--out", str(tmp_path / "k")]) == 0
    # a baseline never turns a violation into a pass: without the declaration it fails
    assert main(["check", "--config", str(cfg), "--results", str(bad), "--out", str(tmp_path / "o")]) == 1


def test_update_summary_lists_what_moved(project, results, tmp_path, capsys):
    cfg, baselines = project
    assert main(["baseline", "update", "--config", str(cfg), "--from-results", str(results)]) == 0
    mtime = (baselines / "cpu" / "sdpa-cpu-smoke.json").stat().st_mtime_ns

    def move(data):
        set_ratio(case_of(data, "bf16-b2-h4-s128-d64")["tensors"]["dq"], 0.9)

    moved = edit_results(results, move)
    summary = tmp_path / "body.md"
    assert (
        main(["baseline", "update", "--config", str(cfg), "--from-results", str(moved), "--summary", str(summary)]) == 0
    )
    text = summary.read_text()
    assert "1 tensor ratios moved beyond noise" in text and "| `bf16-b2-h4-s128-d64` | dq |" in text
    assert "0 cases added, 0 removed" in text  # removing a case takes a change of the suite (tests/test_baselines.py)
    assert (baselines / "cpu" / "sdpa-cpu-smoke.json").stat().st_mtime_ns != mtime
    assert main(["baseline", "show", "--config", str(cfg), "--device", "cpu"]) == 0
    assert "bf16-b2-h4-s128-d64" in capsys.readouterr().out


def test_update_from_a_gpu_artifact_writes_that_class_folder(project, results, capsys):
    """How baselines/h200/ is made from a CI artifact on any machine: the results file's class decides."""
    cfg, baselines = project

    def on_h200(data):
        data["environment"].update(gpu_class="h200", gpu_name="NVIDIA H200", device="cuda")

    h200 = edit_results(results, on_h200)
    assert main(["baseline", "update", "--config", str(cfg), "--from-results", str(h200)]) == 0
    assert (baselines / "h200" / "sdpa-cpu-smoke.json").is_file() and not (baselines / "cpu").exists()
    assert main(["check", "--config", str(cfg), "--results", str(h200), "--out", str(cfg.parent / "o")]) == 0


# ---------------------------------------------------------------- lost coverage and missing data block


def _delete_case(data):
    data["cases"] = [c for c in data["cases"] if c["case_id"] != "bf16-b2-h4-s128-d64"]


def _no_tensors(data):
    case_of(data, "bf16-b2-h4-s128-d64")["tensors"] = {}


def _newly_skipped(data):  # e.g. a user kernel that dropped its softcap keyword, SDPA's "No available kernel"
    c = case_of(data, "bf16-b2-h4-s128-d64")
    c["status"], c["reason"], c["tensors"] = "SKIP", "No available kernel. Aborting execution.", {}


def _lse_dropped(data):
    del case_of(data, "bf16-b2-h4-s128-d64")["tensors"]["lse"]


@pytest.mark.parametrize(
    "edit, rule",
    [
        (_delete_case, "removed_case"),  # same suite hash, no --only note: a truncated results file
        (_no_tensors, "incomplete_pass"),  # a PASS row with no evidence
        (_newly_skipped, "newly_skipped"),
        (_lse_dropped, "tensor_dropped"),
    ],
)
def test_lost_coverage_or_missing_data_fails_closed(cpu_baseline, in_repo_root, results, tmp_path, edit, rule):
    assert judge(cpu_baseline, edit_results(results, edit), tmp_path) == 1
    data = findings_of(tmp_path)
    blocking = [
        (f["severity"], f["rule"], f["case_id"]) for f in data["findings"] if f["severity"] in ("FAIL", "INCONCLUSIVE")
    ]
    assert blocking == [("INCONCLUSIVE", rule, "bf16-b2-h4-s128-d64")]
    assert data["verdict"] == "FAIL" and data["headline"].startswith("FAIL: 1 inconclusive finding in 1 case")


def _duplicate_case(data):
    data["cases"].append(dict(case_of(data, "bf16-b2-h4-s128-d64")))


def test_duplicate_case_ids_are_a_usage_error_naming_the_file(cpu_baseline, project, results, tmp_path, capsys):
    dup = edit_results(results, _duplicate_case)
    for argv in (
        ["check", "--results", str(dup), "--baseline", str(cpu_baseline.path), "--out", str(tmp_path / "o")],
        ["baseline", "update", "--from-results", str(dup)],
    ):
        assert main([*argv, "--config", str(project[0])]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"attn-gate: error: {dup}: 1 case ids appear more than once (bf16-b2-h4-s128-d64)"), err
        assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists() and not project[1].exists()


# ---------------------------------------------------------------- baseline update never drops cases by accident


@pytest.mark.parametrize("with_old", [False, True], ids=["new baseline", "existing baseline"])
@pytest.mark.parametrize(
    "edit, words",
    [
        (
            _delete_case,
            [
                f"holds {SMOKE_CASES - 1} of the {SMOKE_CASES} cases of suite 'smoke'",
                "missing bf16-b2-h4-s128-d64",
                "would drop them",
            ],
        ),
        (_no_tensors, ["1 PASS rows carry no out/dq/dk/dv ratios (bf16-b2-h4-s128-d64)"]),
        (lambda data: data.update(suite_hash="0123456789abcdef"), ["another definition of suite 'smoke'"]),
    ],
    ids=["truncated", "pass without tensors", "other suite definition"],
)
def test_update_refuses_an_incomplete_run(cpu_baseline, project, results, capsys, with_old, edit, words):
    cfg, baselines = project
    path = baselines / "cpu" / "sdpa-cpu-smoke.json"
    if with_old:
        path.parent.mkdir(parents=True)
        shutil.copy(cpu_baseline.path, path)
    before = path.read_bytes() if with_old else None
    bad = edit_results(results, edit)
    assert main(["baseline", "update", "--config", str(cfg), "--from-results", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attn-gate: error: {bad}: ") and len(err.strip().splitlines()) == 1, err
    for w in [*words, "attn-gate baseline update --kernel sdpa-cpu --suite smoke --device cpu"]:
        assert w in err, err
    assert (path.read_bytes() if with_old else path.exists()) == (before if with_old else False)


def test_update_only_without_a_baseline_is_refused_before_the_sweep(
    cpu_baseline, project, results, capsys, monkeypatch
):
    cfg, baselines = project
    monkeypatch.setattr("gate.workflow.check.fresh_sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    assert main(["baseline", "update", "--config", str(cfg), "--device", "cpu", "--only", "s128"]) == 2
    err = capsys.readouterr().err
    assert (
        "there is no baseline at" in err and "run without --only (`attn-gate baseline update --kernel sdpa-cpu" in err
    )
    # the same for a results file made with --only
    filtered = edit_results(
        results, lambda d: d.update(scope="s128", cases=[c for c in d["cases"] if "s128" in c["case_id"]])
    )
    assert main(["baseline", "update", "--config", str(cfg), "--from-results", str(filtered)]) == 2
    assert f"{filtered}: a run filtered with --only 's128', but there is no baseline" in capsys.readouterr().err
    assert not baselines.exists()
    # with a baseline to merge into, the filtered file replaces just its cases
    (baselines / "cpu").mkdir(parents=True)
    shutil.copy(cpu_baseline.path, baselines / "cpu" / "sdpa-cpu-smoke.json")
    assert main(["baseline", "update", "--config", str(cfg), "--from-results", str(filtered)]) == 0
    assert "cases outside the filtered run kept as they were" in capsys.readouterr().out


# ---------------------------------------------------------------- output paths: checked first, OSError is exit 2


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["check", "--device", "cpu", "--out", "/dev/null/x"],
            "--out /dev/null/x: /dev/null exists and is not a directory",
        ),
        (
            ["check", "--device", "cpu", "--out", str(CPU_BASELINE)],
            f"--out {CPU_BASELINE}: exists and is not a directory",
        ),
        (["baseline", "update", "--device", "cpu", "--out", "/dev/null/x"], "--out /dev/null/x: /dev/null exists"),
        (
            ["baseline", "update", "--device", "cpu", "--summary", "/dev/null/s.md"],
            "--summary /dev/null/s.md: /dev/null exists",
        ),
        (["baseline", "update", "--device", "cpu", "--summary", "."], "--summary .: is a directory"),
        (["baseline", "show", "--device", "cpu", "--only", "(causal"], "--only '(causal' is not a regular expression"),
        (
            ["baseline", "update", "--device", "cpu", "--only", "(causal"],
            "--only '(causal' is not a regular expression",
        ),
    ],
    ids=[
        "check out under a file",
        "check out is a file",
        "update out",
        "update summary under a file",
        "update summary is a folder",
        "show bad regex",
        "update bad regex",
    ],
)
def test_unwritable_outputs_and_bad_regex_are_refused_before_the_sweep(project, capsys, monkeypatch, argv, words):
    cfg, baselines = project
    (baselines / "cpu").mkdir(parents=True)
    shutil.copy(CPU_BASELINE, baselines / "cpu" / "sdpa-cpu-smoke.json")
    before = (baselines / "cpu" / "sdpa-cpu-smoke.json").read_bytes()
    monkeypatch.setattr("gate.workflow.check.fresh_sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    assert main([*argv, "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attn-gate: error: ") and words in err and len(err.strip().splitlines()) == 1, err
    assert (baselines / "cpu" / "sdpa-cpu-smoke.json").read_bytes() == before


def test_a_failing_write_is_exit_2_and_the_summary_goes_before_the_baseline(
    cpu_baseline, project, results, tmp_path, capsys, monkeypatch
):
    cfg, baselines = project
    import gate.core.jsonio

    real = gate.core.jsonio.write_text_atomic

    def full_disk_for(name):
        def write(path, text):
            if Path(path).name.startswith(name):
                raise OSError(28, "No space left on device", str(path))
            return real(path, text)

        return write

    def patch_writes(fake):  # every module that took the function by name, and its own
        for module in [m for name, m in sys.modules.items() if name.startswith("gate.")]:
            if getattr(module, "write_text_atomic", None) in (real, current[0]):
                monkeypatch.setattr(module, "write_text_atomic", fake)
        current[0] = fake

    current = [real]
    patch_writes(full_disk_for("body"))
    summary = tmp_path / "body.md"
    assert (
        main(["baseline", "update", "--config", str(cfg), "--from-results", str(results), "--summary", str(summary)])
        == 2
    )
    err = capsys.readouterr().err
    assert (
        f"cannot write {summary} (No space left on device); pass a writable --summary file; the baseline was not written"
        in err
    )
    assert not baselines.exists()  # the summary failed first: no baseline without its summary
    patch_writes(full_disk_for("findings"))
    assert (
        main(
            [
                "check",
                "--config",
                str(cfg),
                "--results",
                str(results),
                "--baseline",
                str(cpu_baseline.path),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "findings-sdpa-cpu-smoke.json (No space left on device); pass a writable --out folder (verdict: PASS)" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "edit, words, fix",
    [
        # every case the same (its case_hash), only the suite hash other: nothing to measure, carry it
        (
            lambda d: d.update(suite_hash="0123456789abcdef"),
            "suite 'smoke' changed since the baseline was made (hash 0123456789abcdef ->",
            "attn-gate baseline carry",
        ),
        (
            lambda d: d["tolerance"].update(mult_dq=d["tolerance"]["mult_dq"] * 2),
            "tolerance multipliers changed",
            "attn-gate baseline update",
        ),
    ],
    ids=["suite changed", "tolerance changed"],
)
def test_a_stale_baseline_is_refused_before_the_sweep(project, capsys, monkeypatch, edit, words, fix):
    """On an H200 a pr check swept for 149 s and only then refused a baseline of the previous suite,
    keeping nothing: the refusal comes first now (and the baseline itself comes through it unchanged)."""
    cfg, baselines = project
    (baselines / "cpu").mkdir(parents=True)
    path = baselines / "cpu" / "sdpa-cpu-smoke.json"
    data = json.loads(CPU_BASELINE.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    before = path.read_bytes()
    monkeypatch.setattr("gate.workflow.check.fresh_sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    assert main(["check", "--config", str(cfg), "--device", "cpu", "--out", str(project[0].parent / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attn-gate: error: {path}: ") and words in err and fix in err, err
    assert path.read_bytes() == before
