"""A worker's life: it dies with the gate (SIGTERM or SIGKILL of `attn-gate`), a dead worker is
noticed while its reply is awaited (a detached grandchild holding the reply pipe does not cost
the case's timeout) and its descendants are killed, a deleted temp folder is made again, and a
kernel that changes its process's state (grad mode off, torch.save patched) runs no later case
in that process. `--workers 0`, where nothing isolates the kernel, fails when no report was
written. The planted kernels are in tests/fault_kernels.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gate.commands.main import main
from tests.test_isolation import ROOT, rows, suite_config


def gate_workers(gate_pid: int) -> list[int]:
    """Live processes started as workers of the gate process `gate_pid` (their environment says so)."""
    needle = f"ATTN_GATE_PARENT_PID={gate_pid}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as fh:
                    env = fh.read().split(b"\0")
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    state = fh.read().rsplit(b")", 1)[1].split()[0]
            except OSError:
                continue
            if needle in env and state != b"Z":
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


pytestmark = pytest.mark.slow  # every test here starts workers and plants a fault: seconds each

linux_only = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc to find the worker processes")


@linux_only
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_worker_dies_with_the_gate(tmp_path, sig):
    """The gate is stopped while its worker hangs in a case: no worker outlives it."""
    config = suite_config(tmp_path, [16, 17])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATTN_GATE_TEST_FAULT": "hang"}
    gate = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gate",
            "sweep",
            "--kernel",
            "tests.fault_kernels:by_env",
            "--suite",
            "tiny",
            "--device",
            "cpu",
            "--config",
            str(config),
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
            "--case-timeout",
            "120",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    journal = tmp_path / "out" / "journal-tests.fault_kernels_by_env-tiny.jsonl"
    try:
        # the first case is journalled: the worker now hangs in the second
        assert wait_for(lambda: journal.is_file() and len(journal.read_text().splitlines()) >= 2, 120)
        workers = gate_workers(gate.pid)
        assert workers
        gate.send_signal(sig)
        gate.wait(timeout=30)
        assert wait_for(lambda: not any(alive(p) for p in workers), 10), "a worker outlived the gate"
    finally:
        gate.kill()
        for pid in gate_workers(gate.pid):
            os.kill(pid, signal.SIGKILL)


@linux_only
def test_a_detached_grandchild_holding_the_pipe_costs_no_timeout_and_is_killed(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    pidfile = tmp_path / "grandchild.pid"
    monkeypatch.setenv("ATTN_GATE_TEST_PIDFILE", str(pidfile))
    config = suite_config(tmp_path, [16, 17, 18])
    started = time.monotonic()
    assert (
        main(
            [
                "sweep",
                "--kernel",
                "tests.fault_kernels:detached_grandchild",
                "--suite",
                "tiny",
                "--device",
                "cpu",
                "--config",
                str(config),
                "--out",
                str(tmp_path / "out"),
                "--no-progress",
                "--case-timeout",
                "100",
            ]
        )
        == 1
    )
    assert time.monotonic() - started < 60  # not the 100 s timeout
    got = rows(tmp_path / "out")
    assert (
        got["fp32-b1-h2-s17-d8"]["status"] == "ERROR" and "died during the case" in got["fp32-b1-h2-s17-d8"]["reason"]
    )
    assert got["fp32-b1-h2-s16-d8"]["status"] == got["fp32-b1-h2-s18-d8"]["status"] == "PASS"
    grandchild = int(pidfile.read_text())
    assert wait_for(lambda: not alive(grandchild), 10), "the kernel's detached grandchild was left running"


@pytest.mark.parametrize("kernel", ["grad_off", "patches_save"])
def test_a_kernel_that_changes_its_process_state_does_not_misreport_later_cases(tmp_path, monkeypatch, kernel):
    """The kernel passes its own case (s17) and leaves the process broken: grad mode off, or a
    torch.save that writes zeros from its next call on. Every later, correct case still passes."""
    monkeypatch.chdir(ROOT)
    config = suite_config(tmp_path, [16, 17, 18, 19])
    assert (
        main(
            [
                "sweep",
                "--kernel",
                f"tests.fault_kernels:{kernel}",
                "--suite",
                "tiny",
                "--device",
                "cpu",
                "--config",
                str(config),
                "--out",
                str(tmp_path / "out"),
                "--no-progress",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    assert {cid: r["status"] for cid, r in rows(tmp_path / "out").items()} == {
        f"fp32-b1-h2-s{n}-d8": "PASS" for n in (16, 17, 18, 19)
    }


@pytest.mark.parametrize("kernel", ["patches_tensor_dunders", "patches_autograd_engine", "rebinds_gate_constant"])
def test_a_kernel_that_patches_tensor_autograd_or_gate_code_is_one_error_row(tmp_path, monkeypatch, kernel):
    """torch.Tensor's @ and /, the autograd engine or a constant of the gate's code, changed by the
    kernel on s17: its own reply went through them (an ERROR row), and every later, correct case
    runs in a fresh worker and passes (they failed in the patched one)."""
    monkeypatch.chdir(ROOT)
    config = suite_config(tmp_path, [16, 17, 18, 19])
    assert (
        main(
            [
                "sweep",
                "--kernel",
                f"tests.fault_kernels:{kernel}",
                "--suite",
                "tiny",
                "--device",
                "cpu",
                "--config",
                str(config),
                "--out",
                str(tmp_path / "out"),
                "--no-progress",
                "--workers",
                "1",
            ]
        )
        == 1
    )
    got = rows(tmp_path / "out")
    assert {cid: r["status"] for cid, r in got.items()} == {
        "fp32-b1-h2-s16-d8": "PASS",
        "fp32-b1-h2-s17-d8": "ERROR",
        "fp32-b1-h2-s18-d8": "PASS",
        "fp32-b1-h2-s19-d8": "PASS",
    }
    assert "replaced" in got["fp32-b1-h2-s17-d8"]["reason"]


def test_a_deleted_temp_folder_is_made_again(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    config = suite_config(tmp_path, [16, 17, 18])
    assert (
        main(
            [
                "sweep",
                "--kernel",
                "tests.fault_kernels:removes_tempdir",
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
    assert "Traceback" not in capsys.readouterr().err
    got = rows(tmp_path / "out")
    assert got["fp32-b1-h2-s17-d8"]["status"] == "ERROR"
    assert got["fp32-b1-h2-s16-d8"]["status"] == got["fp32-b1-h2-s18-d8"]["status"] == "PASS"


def test_workers_0_fails_when_the_kernel_ends_the_process_before_the_report(tmp_path, monkeypatch, capfd):
    """In process, os._exit(0) in a case ends the run: exit 1 and a line that says so, never 0."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("ATTN_GATE_TEST_FAULT", "exit0")
    config = suite_config(tmp_path, [16, 17])
    assert (
        main(
            [
                "sweep",
                "--kernel",
                "tests.fault_kernels:by_env",
                "--suite",
                "tiny",
                "--device",
                "cpu",
                "--config",
                str(config),
                "--out",
                str(tmp_path / "out"),
                "--no-progress",
                "--workers",
                "0",
            ]
        )
        == 1
    )
    err = capfd.readouterr().err
    assert "ended (exit code 0) before it wrote its report" in err and "rerun without --workers 0" in err
    assert not list((tmp_path / "out").glob("sweep-*.json"))


def test_ctrl_c_journals_no_case_in_flight_and_the_printed_resume_reaches_the_same_verdict(tmp_path, monkeypatch):
    """SIGINT after the first case is journalled: the case in flight leaves no row (it was a
    false "ERROR: killed by SIGKILL" that failed the resumed check), the printed `--resume`
    command finishes the run, and its verdict and cases are those of an uninterrupted check."""
    import json
    import shlex

    monkeypatch.chdir(ROOT)
    config = suite_config(tmp_path, [16, 18, 19, 20])
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
    assert main(["check", *common, "--out", str(tmp_path / "whole")]) == 0

    out = tmp_path / "out"
    journal = out / "journal-tests.fault_kernels_by_env-tiny.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATTN_GATE_TEST_SLOW": "1.0"}
    gate = subprocess.Popen(
        [sys.executable, "-m", "gate", "check", *common, "--out", str(out)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as a terminal's Ctrl-C finds it: a test run started in the background inherits SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert wait_for(lambda: journal.is_file() and len(journal.read_text().splitlines()) >= 2, 120)
    gate.send_signal(signal.SIGINT)
    _, err = gate.communicate(timeout=60)
    assert gate.returncode == 2 and "Traceback" not in err, err
    lines = journal.read_text().splitlines()
    assert 2 <= len(lines) < 5 and all(json.loads(row)["status"] == "PASS" for row in lines[1:]), lines
    command = err.strip().splitlines()[-1].strip()
    assert command.startswith("attn-gate check ") and command.endswith(" --resume"), err
    assert main(shlex.split(command)[1:]) == 0

    def verdict(folder: Path) -> dict:
        data = json.loads(next(folder.glob("findings-*.json")).read_text())
        data["context"].pop("run_started_at")
        return data

    assert verdict(out) == verdict(tmp_path / "whole")
    assert rows(out).keys() == rows(tmp_path / "whole").keys()


@linux_only
@pytest.mark.parametrize("kernel", ["forges_reply", "patches_worker_loop"])
def test_a_kernel_that_attacks_the_workers_protocol_is_an_error_and_later_cases_pass(tmp_path, monkeypatch, kernel):
    """A forged reply line in the reply pipe, or the worker's own case function replaced: the
    faulty case is an ERROR row, every later, correct case runs in a fresh worker and passes."""
    monkeypatch.chdir(ROOT)
    config = suite_config(tmp_path, [16, 17, 18, 19])
    assert (
        main(
            [
                "sweep",
                "--kernel",
                f"tests.fault_kernels:{kernel}",
                "--suite",
                "tiny",
                "--device",
                "cpu",
                "--config",
                str(config),
                "--out",
                str(tmp_path / "out"),
                "--no-progress",
                "--workers",
                "1",
            ]
        )
        == 1
    )
    got = {cid: r["status"] for cid, r in rows(tmp_path / "out").items()}
    assert got == {
        "fp32-b1-h2-s16-d8": "PASS",
        "fp32-b1-h2-s17-d8": "ERROR",
        "fp32-b1-h2-s18-d8": "PASS",
        "fp32-b1-h2-s19-d8": "PASS",
    }, got


# the duration of the kernel's escaped sleep: unique to this test process, found in /proc/*/cmdline
SLEEPER_SECONDS = f"307.{os.getpid()}"


def _sleepers() -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                    if SLEEPER_SECONDS.encode() in fh.read().split(b"\0") and alive(int(entry.name)):
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


@linux_only
def test_a_descendant_in_its_own_session_with_an_empty_environment_is_killed(tmp_path):
    """`setsid -f env -i sleep`: neither the process group nor the inherited token finds it; the
    worker is its subreaper, so it is still the worker's descendant when the worker is ended."""
    from tests.test_isolation import cli

    config = suite_config(tmp_path, [16, 17, 18])
    try:
        run = cli(
            [
                "sweep",
                "--kernel",
                "tests.fault_kernels:escapes_with_setsid",
                "--suite",
                "tiny",
                "--device",
                "cpu",
                "--config",
                str(config),
                "--out",
                str(tmp_path / "out"),
                "--no-progress",
            ],
            cwd=tmp_path,
            env={"ATTN_GATE_TEST_SLEEP": SLEEPER_SECONDS},
        )
        assert run.returncode == 0, run.stderr
        assert wait_for(lambda: not _sleepers(), 10), "the kernel's escaped sleep outlived the sweep"
    finally:
        for pid in _sleepers():
            os.kill(pid, signal.SIGKILL)
