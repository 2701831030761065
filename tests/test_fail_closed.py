"""Paths that must fail closed: a kernel calling sys.exit, thresholds that would switch a rule off,
a user function without the `causal` keyword."""

import math

import pytest

from gate.commands.main import main
from gate.core.cases import Case
from gate.core.config import PerfConfig, ToleranceConfig, VerdictConfig, load_config
from gate.core.errors import UserError
from gate.core.results import Status
from gate.correctness.run_case import run_case
from gate.kernels.user import UserAdapter

CASE = Case.build(
    batch=1, seqlen_q=16, seqlen_k=16, heads_q=2, heads_kv=2, head_dim=16, head_dim_v=16, dtype="bf16", seeds=(0,)
)


@pytest.mark.parametrize("fn", ["exits_zero", "exits_one"])
def test_a_kernel_calling_sys_exit_is_an_error_row(fn):
    result = run_case(UserAdapter(f"tests.exiting_kernels:{fn}"), CASE, "cpu", ToleranceConfig())
    assert result.status is Status.ERROR and "SystemExit" in result.reason


@pytest.mark.slow
def test_sweep_with_a_kernel_calling_sys_exit_zero_exits_one(tmp_path, capsys):
    rc = main(
        [
            "sweep",
            "--kernel",
            "tests.exiting_kernels:exits_zero",
            "--suite",
            "smoke",
            "--device",
            "cpu",
            "--only",
            "^bf16-b2-h4-s128-d64$",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert rc == 1


def test_a_command_cut_short_by_system_exit_fails(monkeypatch, capsys):
    import gate.commands.listing as listing

    def bail(args):
        raise SystemExit(0)

    monkeypatch.setattr(listing, "kernels", bail)
    assert main(["kernels"]) == 1
    assert "SystemExit" in capsys.readouterr().err
    monkeypatch.undo()
    assert main(["kernels"]) == 0


@pytest.mark.parametrize(
    ("section", "kwargs"),
    [
        (VerdictConfig, {"headroom_factor": math.nan}),
        (VerdictConfig, {"headroom_factor": 1.0}),
        (VerdictConfig, {"headroom_step": -0.1}),
        (VerdictConfig, {"improvement_factor": math.inf}),
        (PerfConfig, {"regression_pct": math.inf}),
        (PerfConfig, {"regression_pct": 0.0}),
        (PerfConfig, {"alpha": 0.0}),
        (PerfConfig, {"alpha": 1.0}),
        (PerfConfig, {"max_noise_pct": math.nan}),
        (PerfConfig, {"min_rounds": 0}),
        (PerfConfig, {"calls_per_round": 0}),
    ],
)
def test_thresholds_that_would_switch_a_rule_off_are_refused(section, kwargs):
    with pytest.raises(ValueError):
        section(**kwargs)
    section()  # the defaults are valid


def test_a_nan_threshold_in_pyproject_is_a_usage_error(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text("[tool.attn-gate.verdict]\nheadroom_factor = nan\n")
    with pytest.raises(UserError, match=r"headroom_factor = nan must be a number in \(1, 10\]"):
        load_config(path)
    path.write_text("[tool.attn-gate.verdict]\nheadroom_factor = 1.5\n")
    assert load_config(path).verdict.headroom_factor == 1.5


def test_user_kernel_without_causal_keyword_runs_non_causal_cases(tmp_path, monkeypatch):
    (tmp_path / "nocausal.py").write_text(
        "import torch.nn.functional as F\n"
        "def attn(q, k, v, softmax_scale=None):\n"
        "    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=softmax_scale)\n"
        "    return o.transpose(1, 2)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    adapter = UserAdapter("nocausal:attn")
    assert run_case(adapter, CASE, "cpu", ToleranceConfig()).status is Status.PASS
    causal = run_case(adapter, CASE.with_fields(causal=True, seeds=(0,)), "cpu", ToleranceConfig())
    assert causal.status is Status.SKIP and "causal" in causal.reason


SUITE_CONFIG = (
    '[tool.attn-gate]\nbaselines_dir = "baselines"\n[tool.attn-gate.suites.tiny]\nseeds = [0]\n'
    '[[tool.attn-gate.suites.tiny.matrix]]\ndtype = ["fp32"]\nbatch = [1]\nseqlens = ["16"]\nheads = ["2"]\n'
    'head_dims = ["8"]\n'
)


def test_ctrl_c_before_the_first_case_prints_no_resume_command_that_would_fail(tmp_path, monkeypatch, capsys):
    """Stopped before the journal existed: `--resume` would only say "no journal"; the message says
    to run the command again instead. Stopped after it: the `--resume` command, as before."""
    import gate.workflow.sweep as sweep_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    config = tmp_path / "pyproject.toml"
    config.write_text(SUITE_CONFIG)
    command = [
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
    monkeypatch.setattr(sweep_module, "worker_pool", interrupted)
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "--resume" not in err and "nothing to resume" in err, err

    from gate.workflow.journal import Journal

    Journal(tmp_path / "out" / "journal-sdpa-cpu-tiny.jsonl").start({"kernel": "sdpa-cpu"}, resume=False)
    assert main(command) == 2
    assert capsys.readouterr().err.strip().endswith("--resume")


SIGTERM_WRITER = """
import os, signal, sys, time
from pathlib import Path
from gate.commands.main import _on_sigterm
from gate.core import jsonio
signal.signal(signal.SIGTERM, _on_sigterm)
real_replace = os.replace
def replace(src, dst):  # SIGTERM arrives between the temporary file's fsync and its rename
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    real_replace(src, dst)
os.replace = replace
jsonio.write_json_atomic(Path(sys.argv[1]), {"kind": "attn-gate baseline", "schema_version": 3})
"""


def test_sigterm_inside_an_atomic_write_leaves_no_temporary_file(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from tests.conftest import ROOT

    folder = tmp_path / "baselines" / "cpu"
    folder.mkdir(parents=True)
    target = folder / "k-s.json"
    target.write_text('{"old": true}\n')
    proc = subprocess.run(
        [sys.executable, "-c", SIGTERM_WRITER, str(target)],
        cwd=ROOT,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["k-s.json"]  # no .k-s.json.XXXX.tmp beside it
    assert target.read_text() == '{"old": true}\n'


def test_a_worker_start_timeout_names_its_setting_not_case_timeout(tmp_path, capsys, monkeypatch):
    """A worker that does not start in time was reported as "(--case-timeout)", a flag nobody typed."""
    monkeypatch.setenv("ATTN_GATE_FRESH_WORKERS", "1")  # a fresh interpreter: no start within 0.01 s
    config = tmp_path / "pyproject.toml"
    config.write_text(SUITE_CONFIG + "[tool.attn-gate.isolation]\nworker_start_timeout_s = 0.01\n")
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
    err = capsys.readouterr().err
    assert "worker_start_timeout_s" in err and "--case-timeout" not in err, err


def test_an_out_folder_whose_name_is_not_utf8_can_be_locked(tmp_path):
    """`--out $'out\\xff'`: the lock key encoded the path as UTF-8 and raised on its surrogate escape."""
    import os

    from gate.core.files import FolderLock

    folder = tmp_path / os.fsdecode(b"out\xff")
    folder.mkdir()
    with FolderLock(folder, "--out"):
        pass


@pytest.mark.parametrize("command", ["perf", "bench"])
def test_rounds_beyond_the_config_range_is_refused_before_any_work(command, tmp_path, capsys):
    """--rounds 1000000000 timed for hours; it has perf.rounds's range."""
    assert main([command, "--rounds", "1000000000", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "--rounds 1000000000: must be an integer in [1, 1000]" in err and len(err.strip().splitlines()) == 1, err
