"""a kernel runs in a worker process and cannot pass, kill or hang the gate; a killed run
resumes; shards merge into the sweep a single run writes.

The planted kernels are in tests/fault_kernels.py. Cases are tiny (fp32, 1x16-23x2x8) so each
run costs mostly the worker's start (importing torch, ~1-2 s on the CI machine)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gate.commands.main import main
from gate.core.cases import Case
from gate.workflow.shards import assign, expected_cost, parse_shard, shard_cases

ROOT = Path(__file__).resolve().parent.parent


def suite_config(tmp_path: Path, seqlens: list[int], name: str = "tiny") -> Path:
    path = tmp_path / "gate.toml"
    path.write_text(
        f'[tool.attn-gate]\nbaselines_dir = "{tmp_path / "baselines"}"\n'
        f"[tool.attn-gate.suites.{name}]\nseeds = [0]\n[[tool.attn-gate.suites.{name}.matrix]]\n"
        f'dtype = ["fp32"]\nbatch = [1]\nseqlens = {json.dumps([str(s) for s in seqlens])}\nheads = ["2"]\nhead_dims = ["8"]\n'
    )
    return path


def cli(args: list[str], cwd: Path, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """`attn-gate ARGS` in a fresh process run from `cwd` (tests.fault_kernels imports through PYTHONPATH)."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "gate", *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=300, **kw
    )


def rows(out_dir: Path) -> dict[str, dict]:
    (path,) = out_dir.glob("sweep-*.json")
    return {c["case_id"]: c for c in json.loads(path.read_text())["cases"]}


@pytest.mark.slow
def test_each_fault_is_an_error_row_of_its_case_and_the_other_cases_are_measured(tmp_path):
    """os._exit(0), os._exit(3), os.abort(), a segfault, a hang and os.chdir, one case each."""
    config = suite_config(tmp_path, [16, 17, 18, 19, 20, 21, 22, 23])
    work = tmp_path / "cwd"
    work.mkdir()
    out = work / "results"
    started = time.monotonic()
    run = cli(
        [
            "sweep",
            "--kernel",
            "tests.fault_kernels:faulty",
            "--suite",
            "tiny",
            "--device",
            "cpu",
            "--config",
            str(config),
            "--out",
            "results",
            "--case-timeout",
            "4",  # the hang costs it once; every other case of d8 takes milliseconds
            "--no-progress",
        ],
        cwd=work,
    )
    assert run.returncode == 1, run.stderr
    assert time.monotonic() - started < 120
    assert "Traceback" not in run.stderr
    written = run.stdout.strip().splitlines()[-1]
    assert written.startswith("wrote results/sweep-") and (work / written.split()[1]).is_file()  # where the log says
    assert sorted(p.name for p in work.iterdir()) == ["results"]  # nothing else written where it ran
    got = rows(out)
    expected = {
        "fp32-b1-h2-s17-d8": "exited with code 0",
        "fp32-b1-h2-s18-d8": "exited with code 3",
        "fp32-b1-h2-s19-d8": "killed by SIGABRT",
        "fp32-b1-h2-s20-d8": "killed by SIGSEGV",
        "fp32-b1-h2-s21-d8": "timed out after 4 s",
        "fp32-b1-h2-s22-d8": "changed the working directory",
    }
    for case_id, words in expected.items():
        assert got[case_id]["status"] == "ERROR" and words in got[case_id]["reason"], got[case_id]
    assert "Fatal Python error" in got["fp32-b1-h2-s20-d8"]["reason"]  # the stderr tail (faulthandler's stack)
    for case_id in ("fp32-b1-h2-s16-d8", "fp32-b1-h2-s23-d8"):
        assert got[case_id]["status"] == "PASS" and set(got[case_id]["tensors"]) >= {"out", "dq", "dk", "dv"}
    journal = (out / "journal-tests.fault_kernels_faulty-tiny.jsonl").read_text().splitlines()
    assert len(journal) == 1 + 8


@pytest.mark.slow
def test_a_kernel_that_patches_the_measurement_in_its_process_still_fails(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = suite_config(tmp_path, [16])
    assert (
        main(
            [
                "sweep",
                "--kernel",
                "tests.fault_kernels:cheats",
                "--suite",
                "tiny",
                "--device",
                "cpu",
                "--config",
                str(config),
                "--out",
                str(tmp_path / "out"),
                "--no-progress",
            ]
        )
        == 1
    )
    row = rows(tmp_path / "out")["fp32-b1-h2-s16-d8"]
    # the worker's fingerprint sees the gate's own functions replaced: its reply is not trusted
    assert row["status"] == "ERROR" and "gate.correctness.measure.tensor_error was replaced" in row["reason"]
    assert "tests.fault_kernels" not in sys.modules  # the deciding process never imported the kernel
    # in one process the same kernel would have fooled the measurement: that is what the worker prevents
    import gate.correctness.measure as measure
    import gate.correctness.run_case as rc

    saved = (measure.tensor_error, rc.tensor_error, rc.validate_outputs, rc.judge_seed)
    try:
        assert (
            main(
                [
                    "sweep",
                    "--kernel",
                    "tests.fault_kernels:cheats",
                    "--suite",
                    "tiny",
                    "--device",
                    "cpu",
                    "--config",
                    str(config),
                    "--out",
                    str(tmp_path / "inproc"),
                    "--no-progress",
                    "--workers",
                    "0",
                ]
            )
            == 0
        )
    finally:
        measure.tensor_error, rc.tensor_error, rc.validate_outputs, rc.judge_seed = saved


@pytest.mark.slow
def test_check_with_a_kernel_that_exits_zero_fails_closed_with_its_outputs_written(tmp_path, monkeypatch):
    """The issue's headline: os._exit(0) in one case made `check` exit 0 with nothing written."""
    monkeypatch.chdir(ROOT)
    config = suite_config(tmp_path, [16, 17, 18])
    common = [
        "--kernel",
        "tests.fault_kernels:by_env",
        "--suite",
        "tiny",
        "--device",
        "cpu",
        "--config",
        str(config),
        "--no-progress",
    ]
    assert main(["baseline", "update", *common, "--out", str(tmp_path / "base-run")]) == 0
    monkeypatch.setenv("ATTN_GATE_TEST_FAULT", "exit0")  # the workers inherit it
    assert main(["check", *common, "--out", str(tmp_path / "out")]) == 1
    findings = json.loads(next((tmp_path / "out").glob("findings-*.json")).read_text())
    assert findings["verdict"] == "FAIL"
    assert rows(tmp_path / "out")["fp32-b1-h2-s17-d8"]["status"] == "ERROR"
    assert rows(tmp_path / "out")["fp32-b1-h2-s18-d8"]["status"] == "PASS"


@pytest.mark.slow
def test_a_killed_check_resumes_with_only_the_missing_cases_and_the_same_verdict(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    seqlens = [16, 18, 19, 20, 21, 22]
    config = suite_config(tmp_path, seqlens)
    kernel = "tests.fault_kernels:by_env"
    common = ["--kernel", kernel, "--suite", "tiny", "--device", "cpu", "--config", str(config), "--no-progress"]
    assert main(["sweep", *common, "--out", str(tmp_path / "whole")]) == 0
    (results,) = (tmp_path / "whole").glob("sweep-*.json")
    assert main(["baseline", "update", "--from-results", str(results), "--config", str(config)]) == 0

    out = tmp_path / "out"
    journal = out / "journal-tests.fault_kernels_by_env-tiny.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATTN_GATE_TEST_SLOW": "0.7"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gate", "check", *common, "--out", str(out)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (journal.is_file() and len(journal.read_text().splitlines()) >= 3):
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = journal.read_text().splitlines()
    assert 3 <= len(before) < 1 + len(seqlens) and not list(out.glob("findings-*.json"))

    capsys.readouterr()
    assert main(["check", *common, "--out", str(out), "--resume"]) == 0
    assert f"{len(before) - 1} of {len(seqlens)} cases are done" in capsys.readouterr().err
    after = journal.read_text().splitlines()
    assert after[: len(before)] == before and len(after) == 1 + len(seqlens)  # only the missing cases ran
    assert main(["check", "--results", str(results), "--config", str(config), "--out", str(tmp_path / "judged")]) == 0

    def verdict(folder: Path) -> dict:
        data = json.loads(next(folder.glob("findings-*.json")).read_text())
        data["context"].pop("run_started_at")
        return data

    assert verdict(out) == verdict(tmp_path / "judged")


@pytest.mark.slow
def test_resume_refuses_a_journal_of_another_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    config = suite_config(tmp_path, [16, 17])
    args = [
        "sweep",
        "--kernel",
        "sdpa-cpu",
        "--suite",
        "tiny",
        "--device",
        "cpu",
        "--config",
        str(config),
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
    ]
    assert main(args) == 0
    assert main(args + ["--resume", "--only", "s16"]) == 2
    assert "only was None, now 's16'" in capsys.readouterr().err
    assert main(args + ["--resume"]) == 0
    assert "2 of 2 cases are done" in capsys.readouterr().err


@pytest.mark.slow
def test_shards_merge_into_the_sweep_a_single_run_writes(tmp_path, monkeypatch, capsys):
    """Fields that differ by nature: started_at (earliest shard), wall_s (longest shard), each case's seconds."""
    monkeypatch.chdir(ROOT)
    config = suite_config(tmp_path, [16, 17, 18, 19, 33])
    common = [
        "sweep",
        "--kernel",
        "sdpa-cpu",
        "--suite",
        "tiny",
        "--device",
        "cpu",
        "--config",
        str(config),
        "--no-progress",
    ]
    for k in (1, 2):
        assert main(common + ["--out", str(tmp_path / f"s{k}"), "--shard", f"{k}/2"]) == 0
    assert main(common + ["--out", str(tmp_path / "whole"), "--workers", "0"]) == 0  # in process: the same numbers
    assert (
        main(
            ["merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--config", str(config), "--out", str(tmp_path / "m")]
        )
        == 0
    )

    def load(folder):
        data = json.loads(next((tmp_path / folder).glob("sweep-*.json")).read_text())
        for key in ("started_at", "wall_s"):
            data.pop(key)
        for case in data["cases"]:
            case.pop("seconds")
        return data

    assert load("m") == load("whole")
    assert 0 < len(load("s1")["cases"]) < 5
    assert main(common + ["--out", str(tmp_path / "w2"), "--workers", "2"]) == 0  # two workers at once: the same sweep
    assert load("w2") == load("whole")
    (merged,) = (tmp_path / "m").glob("sweep-*.json")
    assert main(["baseline", "update", "--from-results", str(merged), "--config", str(config)]) == 0
    assert main(["check", "--results", str(merged), "--config", str(config), "--out", str(tmp_path / "judged")]) == 0
    capsys.readouterr()

    # overlap, gap, another environment, not a shard, --out one of the shards: exit 2, nothing written
    s1 = next((tmp_path / "s1").glob("sweep-*.json"))
    other = tmp_path / "other"
    other.mkdir()
    edited = json.loads(s1.read_text())
    edited["environment"]["torch"] = "0.0"
    (other / s1.name).write_text(json.dumps(edited))
    bad = {
        "twice": [str(tmp_path / "s1"), str(tmp_path / "s1")],
        "missing": [str(tmp_path / "s1")],
        "environment torch": [str(other), str(tmp_path / "s2")],
        "not a shard": [str(tmp_path / "whole"), str(tmp_path / "s2")],
    }
    for words, folders in bad.items():
        assert main(["merge", *folders, "--config", str(config), "--out", str(tmp_path / "never")]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "never").exists()
    assert (
        main(
            [
                "merge",
                str(tmp_path / "s1"),
                str(tmp_path / "s2"),
                "--config",
                str(config),
                "--out",
                str(tmp_path / "s1"),
            ]
        )
        == 2
    )


def test_shard_parts_are_deterministic_balanced_and_cover_the_suite():
    cases = [
        Case.build(batch=1, seqlen_q=s, seqlen_k=s, heads_q=2, heads_kv=2, head_dim=64, head_dim_v=64, dtype="bf16")
        for s in (1, 97, 128, 256, 512, 1000, 2048, 4096, 33, 64)
    ]
    for n in (1, 2, 3, 4):
        parts = assign(cases, n)
        assert parts == assign(cases, n) and set(parts) <= set(range(1, n + 1))
        picked = [c.id for k in range(1, n + 1) for c in shard_cases(cases, (k, n))]
        assert sorted(picked) == sorted(c.id for c in cases)  # every case in exactly one part
        loads = [sum(expected_cost(c) for c, p in zip(cases, parts) if p == k) for k in range(1, n + 1)]
        assert max(loads) - min(loads) <= max(expected_cost(c) for c in cases)
    assert parse_shard("2/3") == (2, 3)
    for text in ("0/2", "3/2", "a/b", "1/0", "1"):
        with pytest.raises(Exception, match="--shard"):
            parse_shard(text)


def test_a_second_run_on_the_same_out_folder_is_refused(tmp_path, monkeypatch, capsys):
    from gate.core.files import FolderLock

    monkeypatch.chdir(ROOT)
    config = suite_config(tmp_path, [16])
    with FolderLock(tmp_path / "out"):
        assert (
            main(
                [
                    "sweep",
                    "--kernel",
                    "sdpa-cpu",
                    "--suite",
                    "tiny",
                    "--device",
                    "cpu",
                    "--config",
                    str(config),
                    "--out",
                    str(tmp_path / "out"),
                    "--no-progress",
                ]
            )
            == 2
        )
    assert "another attn-gate run is writing there" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_torn_last_journal_line_is_dropped_and_runs_again(tmp_path):
    """SIGKILL in the middle of an append leaves a partial line: it is not a result, and the next
    append starts on a line of its own."""
    from gate.core.results import CaseResult, Status
    from gate.workflow.journal import Journal, read_journal

    case = Case.build(
        batch=1, seqlen_q=8, seqlen_k=8, heads_q=1, heads_kv=1, head_dim=8, head_dim_v=8, dtype="fp32", seeds=(0,)
    )
    other = Case.build(
        batch=1, seqlen_q=9, seqlen_k=9, heads_q=1, heads_kv=1, head_dim=8, head_dim_v=8, dtype="fp32", seeds=(0,)
    )
    header = {
        "kernel": "k",
        "suite": "s",
        "suite_hash": "h",
        "device": "cpu",
        "environment": {},
        "tolerance": {},
        "only": None,
        "checks": [],
        "shard": None,
        "started_at": "t0",
    }
    journal = Journal(tmp_path / "journal.jsonl")
    journal.start(header, resume=False)
    journal.add(CaseResult(case=case, status=Status.SKIP, reason="r"))
    with open(journal.path, "a") as fh:
        fh.write('{"case_id": "fp32-b1-h1-s9-d8", "sta')  # torn
    started, done = read_journal(journal.path, header)
    assert started == "t0" and list(done) == [case.id]
    journal.start(header, resume=True)
    journal.add(CaseResult(case=other, status=Status.SKIP, reason="r"))
    assert list(read_journal(journal.path, header)[1]) == [case.id, other.id]
    with pytest.raises(Exception, match="suite_hash was 'h', now 'x'"):
        read_journal(journal.path, {**header, "suite_hash": "x"})
