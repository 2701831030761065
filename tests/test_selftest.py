"""`attn-gate selftest`: the gate's own teeth, measured through the real check path.

Cheap on purpose: a two-case suite from a config file, one or two planted bugs. The full CPU
selftest (`attn-gate selftest --device cpu --suite smoke`, every bug) runs in .ci/run after the tests.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from gate.commands.main import main
from gate.compare.selftest import BugOutcome, BugStatus, ControlOutcome, SelftestReport, SlowdownSection, SlowdownTrial
from gate.core.cases import Case
from gate.correctness.planted import BUGS, TiledVariant, Trigger, mult_to_catch
from gate.correctness.run_case import make_inputs, run_kernel
from gate.kernels.tiled import TiledAdapter

# Two tiny cases: a causal GQA case with a partial key tile and a dense batch of 2.
TINY = """
[tool.attn-gate.suites.tiny]
seeds = [0]
[[tool.attn-gate.suites.tiny.matrix]]
dtype = ["bf16"]
seqlens = ["70"]
heads = ["4/2"]
head_dims = ["32"]
causal = [true]
"""


def write_config(tmp_path, extra: str = "") -> str:
    path = tmp_path / "pyproject.toml"
    path.write_text("[tool.attn-gate]\n" + extra + TINY)
    return str(path)


def selftest(tmp_path, config: str, *args: str) -> tuple[int, dict, str]:
    out = tmp_path / "out"
    code = main(["selftest", "--device", "cpu", "--suite", "tiny", "--config", config, "--out", str(out), *args])
    report = json.loads((out / "selftest.json").read_text())
    return code, report, (out / "selftest.md").read_text()


def test_selftest_kills_planted_bugs_with_default_thresholds(tmp_path, capsys, monkeypatch):
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, report, md = selftest(tmp_path, write_config(tmp_path), "--bugs", "dk_x1.02,causal_peek")
    assert code == 0, capsys.readouterr()
    assert report["passed"] and report["complete"] and report["schema_version"] == 2
    assert [c["kernel"] for c in report["controls"]] == ["sdpa-cpu", "tiled"] and all(
        c["passed"] for c in report["controls"]
    )
    bugs = {b["name"]: b for b in report["bugs"]}
    assert bugs["dk_x1.02"]["status"] == "KILLED" and bugs["dk_x1.02"]["host"] == "sdpa-cpu"
    assert bugs["causal_peek"]["status"] == "KILLED" and bugs["causal_peek"]["host"] == "tiled"
    assert bugs["causal_peek"]["rule"] in ("tolerance", "status", "headroom") and bugs["causal_peek"]["case_id"]
    assert "not run: planted slowdowns need a CUDA GPU" in report["slowdowns"]["reason"]
    assert "| `dk_x1.02`" in md and "| yes |" in md
    assert summary.read_text().strip() == md.strip()  # the kill matrix lands in the CI step summary


def test_loosened_threshold_lets_a_planted_bug_survive(tmp_path, capsys):
    """mult_dk 50: dK 2% too large stays under its bound and under the headroom rule -> exit 1, named."""
    config = write_config(tmp_path, "[tool.attn-gate.tolerance]\nmult_dk = 50.0\n")
    code, report, md = selftest(tmp_path, config, "--bugs", "dk_x1.02")
    printed = capsys.readouterr().out
    assert code == 1
    (bug,) = report["bugs"]
    assert bug["status"] == "SURVIVED"
    assert "mult_dk <" in bug["message"] and "(now 50)" in bug["message"]
    assert "planted bug dk_x1.02" in printed and "mult_dk <" in printed
    assert "**SURVIVED**" in md


def test_a_bug_the_suite_cannot_exercise_survives_naming_its_axis(tmp_path, capsys):
    code, report, _ = selftest(tmp_path, write_config(tmp_path), "--bugs", "softcap_ignored")
    assert code == 1
    (bug,) = report["bugs"]
    assert bug["status"] == "NOT_EXERCISED" and "a softcap case" in bug["message"]
    assert "a softcap case" in capsys.readouterr().out


def test_a_bug_whose_cases_the_declared_envelope_leaves_out_says_so(tmp_path, capsys, in_repo_root):
    """Every non-contiguous-K case of the suite is GQA and the kernel declares gqa = false: the bug
    is not exercised, and the message says why its cases do not run."""
    kernel = "tests.envelope_kernels:attend"
    extra = f'[tool.attn-gate.kernels."{kernel}".supports]\ngqa = false\n'
    mha = (
        '[[tool.attn-gate.suites.tiny.matrix]]\ndtype = ["bf16"]\nseqlens = ["64"]\nheads = ["2"]\nhead_dims = ["32"]\n'
    )
    gqa_sliced = mha.replace('["2"]', '["4/2"]') + 'layout = ["k_sliced"]\n'
    config = write_config(tmp_path, extra)
    Path(config).write_text(Path(config).read_text() + mha + gqa_sliced)
    code, report, _ = selftest(tmp_path, config, "--bugs", "noncontiguous_k", "--kernel", kernel)
    assert code == 1, capsys.readouterr()
    (bug,) = report["bugs"]
    assert bug["status"] == "NOT_EXERCISED" and "add one to the suite" in bug["message"]
    assert f"; its 1 case of that axis SKIP for {kernel}: declared: no GQA/MQA" in bug["message"], bug["message"]


def test_a_suite_gap_the_kernel_cannot_have_is_reported_not_counted(tmp_path, capsys):
    """The tiny suite has no HND-cache case: sdpa-cpu takes no HND cache, so the HND bug is not
    applicable to it (reported, exit 0); tiled takes one, so there the same gap fails the selftest."""
    config = write_config(tmp_path)
    code, report, md = selftest(tmp_path, config, "--bugs", "hnd_cache_read_as_nhd")
    assert code == 0, capsys.readouterr()
    (bug,) = report["bugs"]
    assert bug["status"] == "NOT_APPLICABLE" and "sdpa-cpu does not take what this bug needs" in bug["message"]
    assert "an HND cache" in bug["message"] and "| not applicable |" in md
    assert "Kill matrix: 0 of 0 planted" in md
    code, report, md = selftest(tmp_path, config, "--bugs", "hnd_cache_read_as_nhd", "--kernel", "tiled")
    assert code == 1
    (bug,) = report["bugs"]
    assert bug["status"] == "NOT_EXERCISED" and "add one to the suite" in bug["message"]
    assert "**not exercised**" in md


def test_a_failing_control_ends_the_selftest_naming_the_case(tmp_path, capsys, in_repo_root):
    """A kernel that fails its own bounds cannot be a control: exit 1, the case named, no bug run."""
    code, report, _ = selftest(tmp_path, write_config(tmp_path), "--kernel", "tests.buggy_kernels:dk_scaled_1_02")
    assert code == 1
    control = report["controls"][0]
    assert not control["passed"] and "bf16-b2-h4/2-s70-d32-causal" in control["detail"]
    assert report["bugs"] == []
    assert "control tests.buggy_kernels:dk_scaled_1_02 failed" in capsys.readouterr().out


def test_a_declared_known_failure_does_not_fail_the_control_and_bugs_are_still_judged(tmp_path, capsys, in_repo_root):
    """The control judges as `check` does: a failure a known_failures declaration covers (SDPA
    flash's batch past 65,535 on pr, say) is recorded in the control's baseline and is KNOWN in the
    second run, so the selftest goes on to its planted bugs; a failure it does not cover still ends it
    (the test above)."""
    known = """
[[tool.attn-gate.known_failures]]
kernel = "tests.buggy_kernels:dk_scaled_1_02"
cases = '-causal$'
tensors = ["dk"]
reason = "dK 2% too large (this test's kernel)"
"""
    code, report, _ = selftest(
        tmp_path, write_config(tmp_path, known), "--kernel", "tests.buggy_kernels:dk_scaled_1_02", "--bugs", "dq_x1.02"
    )
    control = report["controls"][0]
    assert control["passed"], control["detail"]
    (bug,) = report["bugs"]
    assert bug["status"] == "KILLED" and bug["case_id"] == "bf16-b2-h4/2-s70-d32-causal", bug
    assert code == 0


def test_a_control_whose_second_run_disagrees_fails(tmp_path, capsys, in_repo_root, monkeypatch):
    """The control's second sweep is checked against the baseline made from its first: a kernel
    that drifts between runs is a failed control (exit 1, the rule and case named), not a pass."""
    monkeypatch.setattr("tests.buggy_kernels._DRIFT_CALLS", [0])
    code, report, _ = selftest(tmp_path, write_config(tmp_path), "--kernel", "tests.buggy_kernels:drifting")
    assert code == 1
    control = report["controls"][0]
    assert not control["passed"] and "second run fails against the baseline" in control["detail"]
    assert "bf16-b2-h4/2-s70-d32-causal" in control["failing_cases"]


def test_slowdown_plumbing_rehearsed_on_cpu(tmp_path, capsys):
    """The GPU slowdown path (calibration, planted delay, engine, speed rule, report) runs end to
    end on a CPU with a busy-wait; it is reported, never the verdict."""
    config = write_config(
        tmp_path, "[tool.attn-gate.perf]\nrounds = 7\ncalls_per_round = 2\nconfirm_rounds = 0\nwarmup_s = 0.0\n"
    )
    Path(config).write_text(Path(config).read_text().replace("causal = [true]", "causal = [true]\nperf = [true]"))
    code, report, md = selftest(tmp_path, config, "--bugs", "dk_x1.02", "--reps", "1", "--rehearse-slowdowns-on-cpu")
    assert code == 0, capsys.readouterr()
    s = report["slowdowns"]
    assert s["ran"] and not s["gating"] and s["case_id"] == "bf16-b2-h4/2-s70-d32-causal"
    # one judgement per pass and level: each experiment times the slowed pass alone, so the other
    # pass, untimed there, must not count as a trial of that level (an INCONCLUSIVE with no shift)
    levels = sorted((t["pass_"], t["level_pct"]) for t in s["trials"])
    assert levels == sorted((p, lv) for p in ("fwd", "bwd") for lv in (0.0, 1.0, 2.0, 3.0, 5.0, 10.0))
    assert all(math.isfinite(t["shift_pct"]) for t in s["trials"]), s["trials"]
    assert s["calibration"]["cycles"]["bwd+10%"] > s["calibration"]["cycles"]["bwd+1%"] > 0
    assert all(t["severity"] in ("OK", "FAIL", "INCONCLUSIVE", "WARN") for t in s["trials"])
    assert "CPU rehearsal" in md and "| fwd |" in md and set(s["summary"]) == {"fwd", "bwd"}
    # dk_x1.02 is planted around the kernel: tiled hosts none of the chosen bugs, so its control is
    # not swept (on the H200 it swept all of pr, > 7 minutes, before this was fixed)
    assert [c["kernel"] for c in report["controls"]] == ["sdpa-cpu"]


DECODE_PERF = """
[[tool.attn-gate.suites.tiny.matrix]]
dtype = ["bf16"]
entry = ["kvcache"]
batch = [2]
seqlens = ["1x512"]
heads = ["4/2"]
head_dims = ["32"]
page_size = [16]
causal = [true]
perf = [true]
"""


def test_a_decode_slowdown_is_planted_in_its_forward_only(tmp_path, capsys):
    """--slowdown-case picks the perf case: a decode case has no backward, so only its forward is
    slowed, judged and reported (the kvcache entry's speed, which pr and nightly time)."""
    config = write_config(
        tmp_path, "[tool.attn-gate.perf]\nrounds = 7\ncalls_per_round = 2\nconfirm_rounds = 0\nwarmup_s = 0.0\n"
    )
    Path(config).write_text(
        Path(config).read_text().replace("causal = [true]", "causal = [true]\nperf = [true]", 1) + DECODE_PERF
    )
    code, report, md = selftest(
        tmp_path,
        config,
        "--bugs",
        "dk_x1.02",
        "--reps",
        "1",
        "--rehearse-slowdowns-on-cpu",
        "--slowdown-case",
        "kv-page",
    )
    assert code == 0, capsys.readouterr()
    s = report["slowdowns"]
    assert s["ran"] and s["case_id"] == "bf16-b2-h4/2-s1x512-d32-causal-kv-page16"
    assert sorted((t["pass_"], t["level_pct"]) for t in s["trials"]) == [
        ("fwd", lv) for lv in (0.0, 1.0, 2.0, 3.0, 5.0, 10.0)
    ]
    assert set(s["summary"]) == {"fwd"} and "| fwd |" in md and "| bwd |" not in md
    assert s["calibration"]["cycles"]["fwd+10%"] > s["calibration"]["cycles"]["fwd+1%"] > 0
    # by default the cheapest case WITH a backward is slowed (both passes), though the decode case is cheaper
    code, report, _ = selftest(tmp_path, config, "--bugs", "dk_x1.02", "--reps", "1", "--rehearse-slowdowns-on-cpu")
    assert report["slowdowns"]["case_id"] == "bf16-b2-h4/2-s70-d32-causal" and set(report["slowdowns"]["summary"]) == {
        "fwd",
        "bwd",
    }


@pytest.mark.parametrize(
    "args, words",
    [
        (("--slowdown-case", "no-such-case", "--rehearse-slowdowns-on-cpu"), "matches no perf case"),
        (("--slowdown-case", "(", "--rehearse-slowdowns-on-cpu"), "--slowdown-case '(' is not a regular expression"),
        (("--slowdown-case", "kv-page"), "planted slowdowns need a CUDA GPU"),
        (("--slowdown-case", "kv-page", "--no-slowdowns"), "with --no-slowdowns"),
    ],
)
def test_a_slowdown_case_that_cannot_run_is_a_usage_error_before_any_sweep(tmp_path, capsys, args, words):
    """The slowdown test asked for must run: never a selftest that exits 0 without it."""
    config = write_config(tmp_path) + ""
    Path(config).write_text(
        Path(config).read_text().replace("causal = [true]", "causal = [true]\nperf = [true]", 1) + DECODE_PERF
    )
    assert (
        main(
            [
                "selftest",
                "--device",
                "cpu",
                "--suite",
                "tiny",
                "--config",
                config,
                "--out",
                str(tmp_path / "out"),
                "--bugs",
                "dk_x1.02",
                *args,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert words in err and "control" not in err  # refused before the controls swept anything


def test_tiled_control_runs_when_a_chosen_bug_lives_in_tiled(tmp_path, capsys):
    code, report, _ = selftest(tmp_path, write_config(tmp_path), "--bugs", "causal_peek", "--no-slowdowns")
    assert code == 0, capsys.readouterr()
    assert [c["kernel"] for c in report["controls"]] == ["sdpa-cpu", "tiled"]


def test_a_bug_that_cannot_be_planted_counts_as_surviving(tmp_path, capsys, monkeypatch):
    """A wrapper that finds no tensor to perturb (here: dBias on a call without a bias) must not
    read as a kill (its crash would be an ERROR row, which the check fails): NOT_PLANTED, exit 1."""
    import gate.correctness.planted as planted

    bug = planted.PlantedBug(
        "bias_probe", "dBias 2% too large", "kernel", planted.ANY, planted.wrap(planted._bias_grad_scaled)
    )
    monkeypatch.setattr(planted, "BUGS", planted.BUGS + (bug,))
    code, report, _ = selftest(tmp_path, write_config(tmp_path), "--bugs", "bias_probe")
    assert code == 1
    (outcome,) = report["bugs"]
    assert outcome["status"] == "NOT_PLANTED" and "no learnable bias" in outcome["message"]


def test_unknown_bug_is_a_usage_error(tmp_path, capsys):
    code = main(["selftest", "--device", "cpu", "--bugs", "nope", "--out", str(tmp_path)])
    assert code == 2 and "unknown planted bug 'nope'" in capsys.readouterr().err


def test_tiled_variant_without_flags_is_bit_identical_to_tiled():
    """Every difference the gate sees in a tiled-variant bug is the bug, not a re-implementation."""
    case = Case.build(
        batch=2,
        seqlen_q=70,
        seqlen_k=90,
        heads_q=4,
        heads_kv=2,
        head_dim=40,
        head_dim_v=40,
        dtype="bf16",
        causal=True,
        window=(30, 0),
        softcap=10.0,
        alibi=True,
        seeds=(0,),
    )
    inputs = make_inputs(case, 0, "cpu")
    ref, ref_grads = run_kernel(TiledAdapter(), case, inputs)
    got, got_grads = run_kernel(TiledVariant(), case, inputs)
    assert torch.equal(ref.out, got.out) and torch.equal(ref.lse, got.lse)
    assert all(torch.equal(a, b) for a, b in zip(ref_grads, got_grads))


@pytest.mark.parametrize(
    "flag",
    [
        "softcap_before_scale",
        "softcap_ignored",
        "alibi_wrong_sign",
        "causal_window_ignores_window",
        "causal_peek",
        "window_off_by_one",
    ],
)
def test_a_score_bug_changes_nothing_where_its_feature_is_absent_a_custom_bias_included(flag):
    """A planted score bug overrides only its step of tiled's scores (gate/kernels/tiled.py TileSteps):
    on a case without softcap, ALiBi, causal or window it is tiled itself, the trainable bias and its
    gradient included (a re-written score function once dropped the bias, so a variant 'failed' bias
    cases for that, not for its bug)."""
    case = Case.build(
        batch=2,
        seqlen_q=40,
        seqlen_k=56,
        heads_q=4,
        heads_kv=2,
        head_dim=32,
        head_dim_v=32,
        dtype="fp32",
        bias="dense",
        bias_grad=True,
        seeds=(0,),
    )
    inputs = make_inputs(case, 0, "cpu")
    ref, ref_grads = run_kernel(TiledAdapter(), case, inputs)
    got, got_grads = run_kernel(TiledVariant(frozenset({flag}), flag), case, inputs)
    assert torch.equal(ref.out, got.out) and torch.equal(ref.lse, got.lse)
    assert len(ref_grads) == len(got_grads) == 4  # dq, dk, dv, dbias
    assert all(torch.equal(a, b) for a, b in zip(ref_grads, got_grads))


def test_every_bug_declares_an_axis_and_a_host():
    names = [b.name for b in BUGS]
    assert len(names) == len(set(names))
    for b in BUGS:
        assert b.host in ("kernel", "tiled") and b.trigger.axis and b.what
    pending = Trigger("a future axis", lambda c: True, field="no_such_field")
    assert pending.pending and not Trigger("x", lambda c: True).pending


def test_mult_to_catch():
    assert mult_to_catch(max_err=0.05, pt_err=0.01, floor=0.01) == pytest.approx(4.0)
    assert mult_to_catch(max_err=0.005, pt_err=0.01, floor=0.01) == 0.0


def _report(**kw) -> SelftestReport:
    base = dict(
        kernel="k",
        suite="s",
        device="cuda",
        environment={},
        thresholds={},
        complete=True,
        controls=(ControlOutcome("k", True, 3, 0, ""),),
        bugs=(BugOutcome("b", "w", "k", "axis", BugStatus.KILLED),),
    )
    return SelftestReport(**{**base, **kw})


def _trials(pass_, level, severities):
    return tuple(SlowdownTrial(pass_, level, i, s, level, level) for i, s in enumerate(severities))


def test_exit_code_decisions():
    assert _report().exit_code == 0
    assert _report(complete=False).exit_code == 1
    assert _report(controls=(ControlOutcome("k", False, 3, 0, "case x FAIL"),)).exit_code == 1
    for status in (BugStatus.PENDING, BugStatus.NOT_APPLICABLE):
        assert _report(bugs=(BugOutcome("b", "w", "k", "axis", status, message="why"),)).exit_code == 0
    for status in (BugStatus.SURVIVED, BugStatus.NOT_EXERCISED, BugStatus.NOT_PLANTED):
        assert _report(bugs=(BugOutcome("b", "w", "k", "axis", status, message="why"),)).exit_code == 1
    caught = (
        _trials("fwd", 0.0, ["OK", "OK"])
        + _trials("fwd", 2.0, ["FAIL", "OK"])
        + _trials("fwd", 5.0, ["FAIL", "FAIL"])
        + _trials("fwd", 10.0, ["FAIL", "FAIL"])
    )
    s = SlowdownSection(ran=True, levels_pct=(2.0, 5.0, 10.0), trials=caught)
    assert s.smallest_caught("fwd") == 5.0 and s.false_alarms("fwd") == (0, 2)
    assert _report(slowdowns=s).exit_code == 0
    alarm = SlowdownSection(
        ran=True, levels_pct=(10.0,), trials=_trials("fwd", 0.0, ["FAIL"]) + _trials("fwd", 10.0, ["FAIL"])
    )
    assert _report(slowdowns=alarm).exit_code == 1
    noisy = SlowdownSection(
        ran=True, levels_pct=(10.0,), trials=_trials("fwd", 0.0, ["INCONCLUSIVE"]) + _trials("fwd", 10.0, ["FAIL"])
    )
    assert noisy.aa_inconclusive("fwd") == 1 and _report(slowdowns=noisy).exit_code == 1
    rehearsal = SlowdownSection(ran=True, levels_pct=(10.0,), gating=False, trials=_trials("fwd", 0.0, ["FAIL"]))
    assert _report(slowdowns=rehearsal).exit_code == 0  # the CPU rehearsal never decides
    missed = SlowdownSection(
        ran=True, levels_pct=(10.0,), trials=_trials("bwd", 0.0, ["OK"]) + _trials("bwd", 10.0, ["OK"])
    )
    assert _report(slowdowns=missed).exit_code == 1 and missed.smallest_caught("bwd") is None
    assert math.isnan(s.median_shift("bwd", 2.0))


@pytest.mark.parametrize("kernel, suite, device", [("sdpa-cpu", "smoke", "cpu"), ("sdpa-flash", "pr", "cuda")])
def test_shipped_suites_exercise_every_bug_whose_axis_exists(kernel, suite, device):
    """Statically (capabilities only, nothing runs): the CPU selftest on smoke and the H200 one on
    pr have a case for every planted bug that is not pending, on the host it is planted in."""
    from gate.core.cases import load_suite
    from gate.correctness.planted import host_of
    from gate.kernels.registry import get_adapter
    from gate.workflow.selftest import exercising_cases

    adapter = get_adapter(kernel)
    cases = load_suite(suite).cases
    missing = [
        b.name
        for b in BUGS
        if not b.trigger.pending
        and not exercising_cases(
            b, cases, adapter if host_of(b, adapter, cases) == "kernel" else TiledAdapter(), device
        )
    ]
    # pr has no case for these (smoke exercises them on a CPU). Stale either way, this fails: a pr
    # block added for one, or another bug without a pr case.
    assert set(missing) == (AWAITING_PR_BLOCKS if suite == "pr" else set())


AWAITING_PR_BLOCKS = {"hnd_cache_read_as_nhd"}  # no built-in GPU kernel takes an HND cache


def test_the_headline_keeps_the_gates_own_teeth_apart_from_the_users_kernel():
    """Bugs planted in the built-in tiled kernel prove the gate, not the user's kernel: the headline
    says so, and counts apart what ran inside the user's kernel."""
    from gate.report.selftest_report import headline_parts, selftest_markdown

    def bug(name, host, killed=True):
        return BugOutcome(name, "w", host, "axis", BugStatus.KILLED if killed else BugStatus.SURVIVED)

    report = SelftestReport(
        kernel="mine",
        suite="smoke",
        device="cpu",
        environment={},
        thresholds={},
        controls=(ControlOutcome("mine", True, 6, 0, ""), ControlOutcome("tiled", True, 4, 0, "")),
        bugs=tuple(bug(f"t{i}", "tiled") for i in range(24)) + (bug("k1", "mine"), bug("k2", "mine", False)),
        complete=True,
    )
    own, theirs = headline_parts(report)
    assert own == (
        "gate self-check: 24/24 planted bugs killed in the built-in reference kernel (tiled): the gate's "
        "own teeth, not a finding about mine"
    )
    assert theirs == "against mine: control PASS (6 cases measured twice); 1/2 planted bugs killed in mine itself"
    assert own in selftest_markdown(report) and theirs in selftest_markdown(report)
    # no bug ran inside the user's kernel: the headline does not borrow tiled's count for it
    only_tiled = SelftestReport(
        kernel="mine",
        suite="smoke",
        device="cpu",
        environment={},
        thresholds={},
        controls=report.controls[:1],
        bugs=report.bugs[:24],
        complete=True,
    )
    assert (
        headline_parts(only_tiled)[1]
        == "against mine: control PASS (6 cases measured twice); no planted bug ran inside mine"
    )
    # the reference kernel itself under test: its bugs are about it, nothing is set apart
    (line,) = headline_parts(
        SelftestReport(
            kernel="tiled",
            suite="smoke",
            device="cpu",
            environment={},
            thresholds={},
            bugs=report.bugs[:24],
            complete=True,
        )
    )
    assert line == "against tiled: 24/24 planted bugs killed in tiled itself"


@pytest.mark.parametrize(
    "bug, supports",
    [("grid_y_overflow", {"max_batch_heads": 65535}), ("batch_offsets_int32", {"layouts": ["contiguous"]})],
)
def test_a_declared_limit_that_keeps_a_bug_out_of_the_kernel_moves_it_to_tiled(bug, supports):
    """A kernel that declares it never launches past the grid's y limit, or never takes a batch
    strided past 2^31 elements, cannot be judged on those cases: the bug is planted into tiled
    (no suite can hold a case of its axis that this kernel runs). Undeclared, it stays in the kernel."""
    from types import SimpleNamespace

    from gate.core.envelope import check_supports
    from gate.correctness.planted import host_of
    from gate.kernels.capabilities import Capabilities

    (planted,) = [b for b in BUGS if b.name == bug]
    declared = Capabilities.from_declaration(check_supports(supports, "t"), "T")
    assert host_of(planted, SimpleNamespace(capabilities=lambda: declared)) == "tiled"
    assert host_of(planted, SimpleNamespace(capabilities=lambda: Capabilities())) == "kernel"
