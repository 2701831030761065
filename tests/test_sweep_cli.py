"""`attn-gate sweep` end to end on the CPU: exit codes, the JSON report, the validation note,
the table, and one clear line (no traceback) for every kind of bad input."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gate.commands.main import main
from gate.core.results import SweepResult
from tests.conftest import ROOT

HARNESS_FIELDS = {"name", "shape", "dtype", "causal", "fwd_max_abs", "dq_max_abs", "dk_max_abs", "dv_max_abs", "pass"}


@pytest.fixture(scope="module")
def smoke_sweeps(cpu_baseline, tmp_path_factory):
    """The two acceptance sweeps, run once: {kernel: (exit code, stdout, stderr, out dir)}; sdpa-cpu's
    is the sweep this machine's CPU baseline was made from (conftest.py), run the same way.
    (capsys is per test, so output is captured by hand; stdout is then not a terminal, as in CI.)"""
    said = json.loads(cpu_baseline.said.read_text())
    runs = {"sdpa-cpu": (0, said["stdout"], said["stderr"], cpu_baseline.sweep.parent)}
    mp = pytest.MonkeyPatch()
    mp.chdir(ROOT)
    mp.delenv("COLUMNS", raising=False)
    try:
        out = tmp_path_factory.mktemp("tiled")
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):  # the (plain) progress lines
            code = main(["sweep", "--kernel", "tiled", "--suite", "smoke", "--out", str(out)])
        runs["tiled"] = (code, stdout.getvalue(), stderr.getvalue(), out)
    finally:
        mp.undo()
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["sdpa-cpu", "tiled"])
@pytest.mark.xdist_group("sweep_cli")
def test_smoke_sweep_passes_and_writes_report_and_note(smoke_sweeps, kernel):
    code, stdout, _, out = smoke_sweeps[kernel]
    assert code == 0, stdout[-3000:]
    report = json.loads((out / f"sweep-{kernel}-smoke.json").read_text())
    assert report["schema_version"] == 4 and report["kernel"] == kernel and report["suite"] == "smoke"
    assert report["summary"]["FAIL"] == report["summary"]["ERROR"] == 0 and report["summary"]["PASS"] > 0
    rows = report["harness_report"]
    assert rows and all(HARNESS_FIELDS <= set(r) for r in rows)
    assert all(r["pass"] is True for r in rows)
    fp8 = {"e4m3", "e5m2"} if kernel == "tiled" else set()  # sdpa-cpu has no fp8: SKIPPED, no row
    assert {r["dtype"] for r in rows} == {"bf16", "fp16", "fp32"} | fp8 and {r["causal"] for r in rows} == {True, False}
    first = next(r for r in rows if r["name"] == "bf16-b2-h4-s97x257-d64-causal")
    assert first["shape"] == [2, 4, 97, 64] and first["dtype"] == "bf16" and first["causal"] is True
    assert all(
        isinstance(first[k], float) and first[k] >= 0 for k in ("fwd_max_abs", "dq_max_abs", "dk_max_abs", "dv_max_abs")
    )
    # Each case carries the full measurement, and the file reads back.
    case = next(c for c in report["cases"] if c["case_id"] == first["name"])
    dk = case["tensors"]["dk"]
    assert dk["bound"] == pytest.approx(dk["mult"] * dk["pt_err"] + dk["floor"]) and dk["ratio"] <= 1
    assert dk["max_err"] == first["dk_max_abs"]
    assert SweepResult.read(out / f"sweep-{kernel}-smoke.json").kernel == kernel
    note = (out / f"validation-{kernel}-smoke.md").read_text()
    assert note.startswith(f"# Validation note: `{kernel}` on suite `smoke`") and "## Skipped (not validated)" in note
    assert f"wrote {out / f'sweep-{kernel}-smoke.json'}" in stdout


@pytest.mark.slow
@pytest.mark.xdist_group("sweep_cli")
def test_the_note_lists_every_skipped_case_with_its_reason(smoke_sweeps):
    _, _, _, out = smoke_sweeps["sdpa-cpu"]
    report = json.loads((out / "sweep-sdpa-cpu-smoke.json").read_text())
    skipped = [c for c in report["cases"] if c["status"] == "SKIP"]
    assert skipped, "sdpa-cpu skips softcap and Dv != D cases of the smoke suite"
    note = (out / "validation-sdpa-cpu-smoke.md").read_text()
    section = note.split("## Skipped (not validated)")[1]
    for c in skipped:
        assert c["reason"] and f"- `{c['case_id']}`: {c['reason']}" in section
    assert "- `bf16-b2-h2-s150x90-d64-causal-cap20`: no softcap" in section
    assert "- `fp32-b2-h2-s65x33-d64/32`: head_dim_v != head_dim" in section


@pytest.mark.slow
@pytest.mark.xdist_group("sweep_cli")
def test_tiled_validates_every_smoke_case(smoke_sweeps):
    _, _, stderr, out = smoke_sweeps["tiled"]
    report = json.loads((out / "sweep-tiled-smoke.json").read_text())
    assert report["summary"]["SKIP"] == 0
    assert "- none" in (out / "validation-tiled-smoke.md").read_text().split("## Skipped (not validated)")[1]
    # Progress without a terminal: a plain line now and then (not one per case), the last at the end
    n = len(report["cases"])
    progress = [line for line in stderr.splitlines() if line.startswith("[")]
    assert progress and progress[-1].startswith(f"[{n}/{n}] ") and progress[-1].endswith("~0:00 left"), stderr
    assert len(progress) < n and "PASS" not in stderr


@pytest.mark.slow
@pytest.mark.xdist_group("sweep_cli")
def test_the_table_is_readable_in_a_ci_log(smoke_sweeps):
    """Not a terminal: the table is wide enough that case ids are never cut or folded."""
    _, stdout, _, _ = smoke_sweeps["sdpa-cpu"]
    lines = stdout.splitlines()
    for case_id in ("bf16-b4-h4/2-s130-d64-causal-varlen1.97.0.130", "bf16-b2-h2-s150x90-d64-causal-cap20-alibi"):
        assert any(case_id in line and "│" in line for line in lines), case_id
    assert "…" not in stdout
    assert any(line.startswith("PASS: sdpa-cpu on smoke:") for line in lines)


@pytest.mark.slow
def test_a_buggy_user_kernel_fails_the_sweep(tmp_path, capsys, in_repo_root):
    code = main(
        [
            "sweep",
            "--kernel",
            "tests.buggy_kernels:dk_scaled_1_02",
            "--suite",
            "smoke",
            "--only",
            "^fp16-b2-h4-s(97x257|128)-d64-causal$",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert code == 1
    report = json.loads((tmp_path / "sweep-tests.buggy_kernels_dk_scaled_1_02-smoke.json").read_text())
    assert [c["status"] for c in report["cases"]] == ["FAIL", "FAIL"]
    assert all(c["reason"].startswith("dk error ") for c in report["cases"])
    assert all(r["pass"] is False for r in report["harness_report"])
    note = (tmp_path / "validation-tests.buggy_kernels_dk_scaled_1_02-smoke.md").read_text()
    assert "## Failures" in note and "**FAIL** dk error" in note
    assert "FAIL: tests.buggy_kernels:dk_scaled_1_02 on smoke: 0 pass, 2 fail" in capsys.readouterr().out


@pytest.mark.slow
def test_a_crashing_user_kernel_fails_the_sweep_with_error_rows(tmp_path, in_repo_root):
    code = main(
        [
            "sweep",
            "--kernel",
            "tests.buggy_kernels:raises",
            "--suite",
            "smoke",
            "--only",
            "^bf16-b2-h4-s1-d64",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert code == 1
    report = json.loads((tmp_path / "sweep-tests.buggy_kernels_raises-smoke.json").read_text())
    assert {c["status"] for c in report["cases"]} == {"ERROR"}


BAD_MATRIX = """
[tool.attn-gate.suites.mine]
seeds = [0]
[[tool.attn-gate.suites.mine.matrix]]
heads = ["6/4"]
"""


def bad_inputs(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text(BAD_MATRIX)
    return {
        "unknown kernel": (
            ["--kernel", "flash9", "--suite", "smoke"],
            "--kernel 'flash9' is not a known kernel; choose one of",
        ),
        "unknown suite": (
            ["--kernel", "tiled", "--suite", "smok"],
            "unknown suite 'smok'; choose one of: nightly, pr, smoke",
        ),
        "invalid matrix": (
            ["--kernel", "tiled", "--suite", "smoke", "--config", str(config)],
            f"{config} [tool.attn-gate.suites.mine] matrix[0]: invalid case",
        ),
        "module does not import": (
            ["--kernel", "no_such_pkg.kernels:attn", "--suite", "smoke"],
            "--kernel 'no_such_pkg.kernels:attn': module 'no_such_pkg.kernels' does not import "
            "(ModuleNotFoundError: No module named 'no_such_pkg'); check the name and that it is on PYTHONPATH",
        ),
        "no such function": (
            ["--kernel", "tests.buggy_kernels:nope", "--suite", "smoke"],
            "--kernel 'tests.buggy_kernels:nope': tests.buggy_kernels has no attribute 'nope'",
        ),
        "bad spec": (
            ["--kernel", "tests.buggy_kernels:", "--suite", "smoke"],
            "a user kernel is named 'package.module:function'",
        ),
        "only matches nothing": (
            ["--kernel", "tiled", "--suite", "smoke", "--only", "^nothing$"],
            "--only '^nothing$' matches no case",
        ),
        "missing config": (
            ["--kernel", "tiled", "--suite", "smoke", "--config", str(tmp_path / "none.toml")],
            "no such file",
        ),
        "bad regex": (
            ["--kernel", "tiled", "--suite", "smoke", "--only", "(causal"],
            "--only '(causal' is not a regular expression",
        ),
        "out is a file": (
            ["--kernel", "tiled", "--suite", "smoke", "--out", str(config)],
            f"--out {config}: exists and is not a directory; pass a folder",
        ),
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    "what",
    [
        "unknown kernel",
        "unknown suite",
        "invalid matrix",
        "module does not import",
        "no such function",
        "bad spec",
        "only matches nothing",
        "missing config",
        "out is a file",
        "bad regex",
    ],
)
def test_bad_input_exits_2_with_one_line(what, tmp_path, capsys, in_repo_root):
    args, words = bad_inputs(tmp_path)[what]
    out_dir = tmp_path / "out"
    assert main(["sweep", "--out", str(out_dir), *args, "--no-progress"]) == 2  # a later --out wins
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("attn-gate: error: ") and words in lines[0], captured.err
    assert captured.out == "" and not out_dir.exists()


@pytest.mark.slow
def test_a_kernel_module_that_fails_on_import_is_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "broken_kernel.py").write_text(
        "raise ImportError('libcuda.so.1: cannot open shared object file\\nmore')\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "--kernel", "broken_kernel:attn", "--suite", "smoke", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ImportError: libcuda.so.1: cannot open shared object file)" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_device_cuda_without_a_gpu_is_one_line(tmp_path, capsys):
    assert (
        main(
            [
                "sweep",
                "--kernel",
                "tiled",
                "--suite",
                "smoke",
                "--device",
                "cuda",
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
        == 2
    )
    assert (
        capsys.readouterr().err
        == "attn-gate: error: --device cuda: no CUDA GPU is visible here; leave --device out to use the CPU\n"
    )


def test_usage_errors_exit_2():
    assert main(["sweep", "--device", "tpu"]) == 2
    assert main(["nosuchcommand"]) == 2


def attn_gate_executable() -> str:
    exe = Path(sys.executable).with_name("attn-gate")
    found = str(exe) if exe.exists() else shutil.which("attn-gate")
    assert found, "the attn-gate console script is not installed (pip install -e .)"
    return found


@pytest.mark.slow
@pytest.mark.parametrize("what", ["module does not import", "invalid matrix"])
def test_real_command_prints_one_line_and_no_traceback(what, tmp_path):
    args, words = bad_inputs(tmp_path)[what]
    proc = subprocess.run(
        [attn_gate_executable(), "sweep", *args, "--out", str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout and proc.stdout == ""


@pytest.mark.slow
@pytest.mark.xdist_group("sweep_cli")
def test_reasons_are_printed_literally_not_as_rich_markup(smoke_sweeps):
    """A kernel's exception text is data: '[/]' or '[bold]' in it must neither crash nor vanish."""
    from rich.console import Console

    from gate.core.cases import Case
    from gate.core.results import CaseResult, Status
    from gate.report.sweep_report import print_table

    _, _, _, out = smoke_sweeps["tiled"]
    sweep = SweepResult.read(out / "sweep-tiled-smoke.json")
    case = Case.build(batch=1, seqlen_q=8, seqlen_k=8, heads_q=1, heads_kv=1, head_dim=8, head_dim_v=8, dtype="bf16")
    reason = "RuntimeError: expected [bold] shape [1, 8] got [/] [8, 1]"
    broken = SweepResult(**{**sweep.__dict__, "cases": (CaseResult(case=case, status=Status.ERROR, reason=reason),)})
    buffer = io.StringIO()
    print_table(broken, console=Console(file=buffer, width=250))
    assert reason in buffer.getvalue()
    assert "FAIL: tiled on smoke: 0 pass, 0 fail, 1 error" in buffer.getvalue()


@pytest.mark.slow
def test_a_sweep_where_every_case_is_skipped_fails(tmp_path, capsys, in_repo_root):
    """Nothing validated is not a pass (fail closed): the user kernel takes no softcap."""
    code = main(
        [
            "sweep",
            "--kernel",
            "tests.buggy_kernels:correct",
            "--suite",
            "smoke",
            "--only",
            "s150x90-d64-causal-cap20",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert code == 1
    assert "FAIL: tests.buggy_kernels:correct on smoke: 0 pass, 0 fail, 0 error, 2 skip" in capsys.readouterr().out


@pytest.mark.slow
def test_a_report_folder_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch, in_repo_root):
    import gate.commands.sweep

    def refuse(*_a, **_k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(gate.commands.sweep, "write_sweep_outputs", refuse)
    assert (
        main(
            [
                "sweep",
                "--kernel",
                "tiled",
                "--suite",
                "smoke",
                "--only",
                "^bf16-b2-h4-s1-d64$",
                "--out",
                str(tmp_path / "ro"),
                "--no-progress",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write the report there (Permission denied)" in err
