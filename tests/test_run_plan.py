"""The run plan is resolved once: a `check` (and a `baseline update`) loads its suite once and turns
the kernel's name into an adapter once, however many steps (names check, stale-baseline check,
sweep, completeness checks) read it. Counted with monkeypatch where every module calls them."""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path

import pytest

import gate.commands.main
import gate.core.cases
import gate.kernels.registry
import gate.speed.runs
import gate.workflow.check
import gate.workflow.plan
import gate.workflow.speed_check
import gate.workflow.sweep
import gate.workflow.validate
from gate.commands.main import main
from gate.core.config import load_config
from gate.core.identity import Scope
from gate.kernels.registry import KernelEntry
from gate.workflow.check import FreshSweep, outputs, run_check
from gate.workflow.plan import resolve_plan
from gate.workflow.sweep import SweepOptions

ROOT = Path(__file__).resolve().parent.parent
FEW = "^bf16-b2-h4-s128-d64"  # a few smoke cases: the walk is what is counted, not the sweep


def counted(monkeypatch, module, name: str) -> list:
    """Calls of module.name, from whichever gate module calls it (each imported it by name)."""
    original, calls = getattr(module, name), []

    def counting(*args, **kwargs):
        calls.append(args[0] if args else kwargs)
        return original(*args, **kwargs)

    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("gate") and getattr(mod, name, None) is original:
            monkeypatch.setattr(mod, name, counting)
    return calls


def counted_adapters(monkeypatch) -> list:
    """The names whose adapter is built in this process (KernelEntry.adapter)."""
    original, built = KernelEntry.adapter, []

    def counting(self):
        built.append(self.name)
        return original(self)

    monkeypatch.setattr(KernelEntry, "adapter", counting)
    return built


@pytest.fixture
def calls(monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    return {
        "expand_suite": counted(monkeypatch, gate.core.cases, "expand_suite"),
        "kernel_entry": counted(monkeypatch, gate.kernels.registry, "kernel_entry"),
        "adapter": counted_adapters(monkeypatch),
    }


def test_check_loads_the_suite_once_and_resolves_the_kernel_once(cpu_baseline, calls, tmp_path):
    with contextlib.chdir(ROOT):
        rc = main(
            [
                "check",
                "--baseline",
                str(cpu_baseline.path),
                "--device",
                "cpu",
                "--kernel",
                "sdpa-cpu",
                "--suite",
                "smoke",
                "--only",
                FEW,
                "--no-progress",
                "--workers",
                "1",
                "--out",
                str(tmp_path / "out"),
            ]
        )
    assert rc == 0
    assert calls["expand_suite"].count("smoke") == 1, calls["expand_suite"]
    assert calls["kernel_entry"] == ["sdpa-cpu"]  # the name resolved once
    assert calls["adapter"] == ["sdpa-cpu"]  # checked here; the sweep runs it in a worker


def test_an_in_process_sweep_reuses_the_plans_adapter(cpu_baseline, calls, tmp_path):
    with contextlib.chdir(ROOT):
        config = load_config(cpu_baseline.config)  # its baselines_dir holds this machine's baseline
        plan = resolve_plan(config, "sdpa-cpu", "smoke", "cpu", FEW, SweepOptions(workers=0))
        outcome = run_check(plan, FreshSweep(progress=False), outputs(tmp_path / "out", config))
    assert outcome.exit_code == 0 and outcome.sweep.scope == Scope(FEW)
    assert calls["expand_suite"].count("smoke") == 1
    assert calls["kernel_entry"] == ["sdpa-cpu"] and calls["adapter"] == ["sdpa-cpu"]


def test_baseline_update_loads_the_suite_once(cpu_baseline, calls, tmp_path):
    baselines = tmp_path / "baselines"
    shutil.copytree(cpu_baseline.path.parent, baselines / "cpu")
    config = tmp_path / "pyproject.toml"
    config.write_text(f'[tool.attn-gate]\nbaselines_dir = "{baselines}"\n')
    rc = main(
        [
            "baseline",
            "update",
            "--config",
            str(config),
            "--device",
            "cpu",
            "--kernel",
            "sdpa-cpu",
            "--suite",
            "smoke",
            "--only",
            FEW,
            "--no-progress",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert rc == 0
    assert calls["expand_suite"].count("smoke") == 1, calls["expand_suite"]
    assert calls["kernel_entry"] == ["sdpa-cpu"] and calls["adapter"] == ["sdpa-cpu"]


@pytest.mark.slow  # times two perf cases in a worker (~25 s on 2 cores)
def test_check_with_perf_reads_the_perf_cases_from_the_plan(calls, tmp_path):
    with contextlib.chdir(ROOT):
        main(
            [
                "check",
                "--device",
                "cpu",
                "--kernel",
                "sdpa-cpu",
                "--suite",
                "smoke",
                "--perf",
                "--no-progress",
                "--only",
                "^bf16-b2-h4-s(128|256)-d64(-causal)?$",
                "--workers",
                "1",
                "--out",
                str(tmp_path / "out"),
            ]
        )
    assert (tmp_path / "out" / "perf-sdpa-cpu-smoke.json").is_file()  # the speed step ran
    assert calls["expand_suite"].count("smoke") == 1, calls["expand_suite"]
    # the anchor (sdpa-math on a CPU) is the anchor's own entry; the kernel's name is resolved once
    assert calls["kernel_entry"].count("sdpa-cpu") == 1 and calls["adapter"].count("sdpa-cpu") == 1


# Two tiny cases (tests/test_selftest.py's suite): the walk is what is counted, not the sweep.
TINY = """[tool.attn-gate]
[tool.attn-gate.suites.tiny]
seeds = [0]
[[tool.attn-gate.suites.tiny.matrix]]
dtype = ["bf16"]
seqlens = ["70"]
heads = ["4/2"]
head_dims = ["32"]
causal = [true]
"""


def test_selftest_derives_every_planted_bugs_plan_from_one_plan(calls, tmp_path):
    config = tmp_path / "pyproject.toml"
    config.write_text(TINY)
    args = ["selftest", "--device", "cpu", "--suite", "tiny", "--config", str(config), "--out", str(tmp_path / "out")]
    # one bug planted in the kernel, one in tiled: two hosts, two controls, four sweeps at least
    rc = main([*args, "--bugs", "dk_x1.02,causal_peek", "--no-slowdowns"])
    assert rc == 0
    assert calls["expand_suite"].count("tiny") == 1, calls["expand_suite"]
    # each host's name resolved once, however many sweeps and plantings use it
    assert sorted(calls["kernel_entry"]) == ["sdpa-cpu", "tiled"], calls["kernel_entry"]
