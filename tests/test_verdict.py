"""The verdict rules, table-driven: each rule FAILS (or warns) on a crafted bad input and stays
silent on a good one; comparing a result with itself never fails. No sweep runs here: results
are built directly, so this file takes well under a second."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from gate.compare.baselines import Baseline
from gate.compare.findings import STATUS, Advice, Finding, Quantity, Rule, Severity, Subject, advised, decide
from gate.compare.sweep_rules import (
    check_comparable,
    compare,
    compare_environment,
    is_headroom_regression,
    is_large_improvement,
    refuse_duplicate_cases,
    rule_case_presence,
    rule_env_drift,
    rule_headroom,
    rule_improvement,
    rule_incomplete_pass,
    rule_nothing_measured,
    rule_status,
    rule_tensor_presence,
    rule_tolerance,
)
from gate.core.cases import Case
from gate.core.config import VerdictConfig
from gate.core.errors import UserError
from gate.core.identity import Environment, Scope
from gate.core.results import CaseResult, Status, SweepResult, TensorError

CFG = VerdictConfig(headroom_factor=1.5, headroom_step=0.1, improvement_factor=2.0)
ENV = {
    "device": "cpu",
    "gpu_class": "cpu",
    "gpu_name": "none",
    "torch": "2.13.0",
    "driver": "none",
    "cuda": "none",
    "kernel": "k",
    "kernel_version": "1",
    "attn_gate": "0.1.0",
    "python": "3.11",
    "machine": "x86_64",
    "cpu": "x86_64",
}
TOL = {"mult_out": 2.0, "mult_dq": 3.0}


def case(n: int) -> Case:
    """Distinct, stable cases: the seqlen tells them apart (ids like bf16-b1-h1-s7-d8)."""
    return Case.build(batch=1, seqlen_q=n, seqlen_k=n, heads_q=1, heads_kv=1, head_dim=8, head_dim_v=8, dtype="bf16")


def tensor(name: str, ratio: float) -> TensorError:
    return TensorError(
        tensor=name,
        max_err=ratio * 0.01,
        mean_err=ratio * 0.001,
        pt_err=0.004,
        floor=0.002,
        mult=2.0,
        bound=0.01,
        ratio=ratio,
        worst_index=(0,),
        band_atol=5e-3,
        band_rtol=5e-3,
        band_ok=True,
        seed=0,
    )


def result(n: int, status: str = "PASS", reason: str = "", **ratios: float) -> CaseResult:
    return CaseResult(
        case=case(n), status=Status(status), reason=reason, tensors=tuple(tensor(name, r) for name, r in ratios.items())
    )


def sweep(
    *cases: CaseResult,
    env: dict | None = None,
    suite_hash: str = "h1",
    tolerance: dict | None = None,
    notes: tuple[str, ...] = (),
    scope: str | None = None,
) -> SweepResult:
    return SweepResult(
        kernel="k",
        suite="smoke",
        suite_hash=suite_hash,
        environment=dict(env or ENV),
        cases=tuple(cases),
        tolerance=dict(tolerance or TOL),
        started_at="2026-01-01T00:00:00+00:00",
        wall_s=1.0,
        notes=notes,
        scope=Scope(scope),
    )


# A PASS always carries out, dq, dk and dv (run_case measures all four); lse where the kernel returns it.
GOOD = sweep(
    result(1, out=0.2, lse=0.1, dq=0.3, dk=0.25, dv=0.22),
    result(2, out=0.0, dq=0.01, dk=0.01, dv=0.01),
    result(3, "SKIP", "no softcap"),
    result(4, out=0.6, dq=0.5, dk=0.9, dv=0.5),
)
ACCEPT = "attn-gate baseline update --kernel k --suite smoke --device cpu"


def rules_of(
    findings: list[Finding], severities=(Severity.FAIL, Severity.INCONCLUSIVE, Severity.WARN)
) -> set[tuple[str, str, str]]:
    return {(f.severity.value, f.rule, f.case_id) for f in findings if f.severity in severities}


# ---------------------------------------------------------------- one table per rule


@pytest.mark.parametrize(
    "ratio, fails",
    [
        (0.0, False),
        (0.99, False),
        (1.0, False),  # at the bound is within it
        (1.0001, True),
        (3.5, True),
        (math.inf, True),
        (math.nan, True),  # NaN never passes
    ],
)
def test_rule_tolerance(ratio, fails):
    f = rule_tolerance("c", "dk", ratio)
    assert (f is not None and f.severity is Severity.FAIL) == fails, f
    if fails:
        assert f.metric == "ratio:dk" and f.threshold == 1.0


@pytest.mark.parametrize(
    "base, cur, expected",
    [
        ("PASS", "PASS", None),
        (None, "PASS", None),
        ("SKIP", "SKIP", None),
        ("PASS", "FAIL", "newly fails"),
        ("PASS", "ERROR", "newly errors"),
        (None, "FAIL", "newly fails"),
        ("FAIL", "FAIL", "still fails"),  # a baseline written with --allow-failing never turns a FAIL into a pass
        ("FAIL", "ERROR", "errors (baseline: FAIL)"),
    ],
)
def test_rule_status(base, cur, expected):
    f = rule_status("c", base, cur, "why")
    if expected is None:
        assert f is None
    else:
        assert f.severity is Severity.FAIL and expected in f.message and "why" in f.message


@pytest.mark.parametrize(
    "base, cur, fails",
    [
        (0.30, 0.30, False),
        (0.30, 0.44, False),  # x1.47: below the factor
        (0.30, 0.46, True),  # x1.53 and +0.16: both
        (0.01, 0.09, False),  # x9 but only +0.08: tiny ratios do not flake (the step)
        (0.00, 0.09, False),  # from an exact zero: still only +0.09
        (0.00, 0.11, True),  # from zero, beyond the step
        (0.50, 0.61, False),  # +0.11 but only x1.22
        (0.60, 0.95, True),  # x1.58 and +0.35: loosening that stays within the bound
        (0.60, 1.50, False),  # above 1 it is rule_tolerance's FAIL, not reported twice
        (math.nan, 0.9, False),  # no usable baseline number: no relative judgement
    ],
)
def test_rule_headroom(base, cur, fails):
    f = rule_headroom("c", "dq", base, cur, CFG.headroom_factor, CFG.headroom_step)
    assert (f is not None and f.severity is Severity.FAIL) == fails, f
    if fails:
        assert f.threshold == pytest.approx(max(base * 1.5, base + 0.1))
        assert f"{base:g}"[:3] in f.message or "0 ->" in f.message


@pytest.mark.parametrize(
    "base, cur, warns",
    [
        (0.6, 0.6, False),
        (0.6, 0.31, False),
        (0.6, 0.30, True),
        (0.9, 0.1, True),
        (0.05, 0.001, False),  # /50 but only -0.049: noise, not an improvement worth a refresh
    ],
)
def test_rule_improvement(base, cur, warns):
    f = rule_improvement("c", "out", base, cur, CFG.improvement_factor, CFG.headroom_step)
    assert (f is not None and f.severity is Severity.WARN) == warns, f
    assert (f is not None) == is_large_improvement(base, cur, 2.0, 0.1)


@pytest.mark.parametrize(
    "base, cur, same_suite, rule, severity",
    [
        ("PASS", "PASS", True, None, None),
        ("FAIL", "FAIL", True, None, None),  # rule_status speaks for that
        (None, "PASS", True, "new_case", Severity.WARN),
        ("PASS", None, True, "removed_case", Severity.INCONCLUSIVE),  # same suite, case missing: truncated results
        ("SKIP", None, True, "removed_case", Severity.INCONCLUSIVE),
        ("PASS", None, False, "removed_case", Severity.WARN),  # the suite itself changed (check refuses that first)
        ("PASS", "SKIP", True, "newly_skipped", Severity.INCONCLUSIVE),  # e.g. softcap keyword dropped: coverage lost
        ("ERROR", "SKIP", True, "newly_skipped", Severity.INCONCLUSIVE),  # a failing case may not escape by skipping
        ("SKIP", "PASS", True, "newly_measured", Severity.WARN),
        ("FAIL", "PASS", True, "fixed", Severity.WARN),
        ("SKIP", "SKIP", True, "skipped", Severity.INFO),
    ],
)
def test_rule_case_presence(base, cur, same_suite, rule, severity):
    f = rule_case_presence("c", base, cur, "No available kernel", same_suite, ACCEPT)
    assert (f.rule, f.severity) == (rule, severity) if rule else f is None
    if rule == "newly_skipped":  # says why, and how to accept the loss on purpose
        assert "No available kernel" in f.message and f"`{ACCEPT}`" in f.message and f.severity.blocks


@pytest.mark.parametrize(
    "base, cur, rule, blocks",
    [
        (0.2, None, "tensor_dropped", True),  # e.g. the kernel stopped returning its LSE
        (None, 0.2, "tensor_added", False),
        (0.2, 0.3, None, False),
    ],
)
def test_rule_tensor_presence(base, cur, rule, blocks):
    f = rule_tensor_presence("c", "lse", base, cur, ACCEPT)
    assert (f.rule if f else None) == rule
    assert (f is not None and f.severity.blocks) == blocks
    if blocks:
        assert f.severity is Severity.INCONCLUSIVE and ACCEPT in f.message


@pytest.mark.parametrize(
    "status, tensors, missing",
    [
        ("PASS", {"out", "dq", "dk", "dv"}, None),
        ("PASS", {"out", "lse", "dq", "dk", "dv"}, None),
        ("PASS", set(), "out, dq, dk, dv"),  # a PASS row with no evidence at all
        ("PASS", {"out", "lse", "dq", "dk"}, "dv"),
        ("PASS", {"out"}, "dq, dk, dv"),
        ("FAIL", set(), None),  # a bad output FAILs without tensors: rule_status speaks
        ("SKIP", set(), None),
    ],
)
def test_rule_incomplete_pass(status, tensors, missing):
    f = rule_incomplete_pass("c", status, tensors)
    assert (f is not None) == (missing is not None), f
    if f:
        assert f.severity is Severity.INCONCLUSIVE and f"PASS without {missing}:" in f.message


@pytest.mark.parametrize(
    "key, base, cur, severity",
    [
        ("torch", "2.13.0", "2.13.0", None),
        ("torch", "2.13.0", "2.14.0", Severity.WARN),
        ("driver", "570.1", "575.2", Severity.WARN),
        ("kernel_version", "2.8.3", "2.8.4", Severity.WARN),
        ("cuda", "12.8", "13.0", Severity.WARN),
        ("cudnn", "91002", "91900", Severity.WARN),  # SDPA-cuDNN's kernel and the speed anchor
        ("machine", "x86_64", "aarch64", Severity.WARN),
        ("attn_gate", "0.1.0", "0.2.0", Severity.INFO),
        ("started", "a", "b", None),  # not a fingerprint key
    ],
)
def test_rule_env_drift(key, base, cur, severity):
    f = rule_env_drift(key, base, cur)
    assert (f.severity if f else None) == severity
    if f:
        assert base in f.message and cur in f.message


@pytest.mark.parametrize("measured, blocks", [(0, True), (1, False)])
def test_rule_nothing_measured(measured, blocks):
    f = rule_nothing_measured(measured, 4)
    assert (f is not None and f.severity.blocks) == blocks


def test_headroom_needs_both_thresholds():
    assert is_headroom_regression(0.2, 0.5, 1.5, 0.1)
    assert not is_headroom_regression(0.2, 0.29, 1.5, 0.1)  # x1.45
    assert not is_headroom_regression(0.02, 0.08, 1.5, 0.1)  # x4, +0.06


# ---------------------------------------------------------------- the join, end to end


def test_self_comparison_never_fails_or_warns():
    for s in (
        GOOD,
        sweep(result(1, out=0.999, dq=0.0, dk=0.0, dv=1.0)),
        sweep(result(1, "SKIP", "x"), result(2, out=0.5, dq=0.5, dk=0.5, dv=0.5)),
    ):
        findings = compare(Baseline.from_sweep(s), s, CFG)
        assert not rules_of(findings), rules_of(findings)
        assert decide(findings).passed


def test_self_comparison_of_a_failing_result_fails_only_on_absolute_rules():
    bad = sweep(
        result(1, out=0.2, dq=0.2, dk=0.2, dv=0.2),
        result(2, "FAIL", "dk error > bound", dk=1.7),
        result(3, "ERROR", "RuntimeError: boom"),
    )
    findings = compare(Baseline.from_sweep(bad), bad, CFG)
    blocking = {(f.rule, f.case_id) for f in findings if f.severity.blocks}
    assert blocking == {("tolerance", case(2).id), ("status", case(2).id), ("status", case(3).id)}
    assert not decide(findings).passed


BASE = GOOD
CURRENT_TABLE = [
    # (name, current sweep, expected FAIL/WARN set as (severity, rule, case n), passes)
    ("identical", GOOD, set(), True),
    (
        "tolerance violation",
        sweep(result(1, "FAIL", "dk", out=0.2, lse=0.1, dq=0.3, dk=1.3, dv=0.22), *GOOD.cases[1:]),
        {("FAIL", "tolerance", 1), ("FAIL", "status", 1)},
        True and False,
    ),
    ("newly errors", sweep(result(1, "ERROR", "RuntimeError: bad"), *GOOD.cases[1:]), {("FAIL", "status", 1)}, False),
    (
        "fails with no tensors",
        sweep(result(1, "FAIL", "seed 0: out has shape (1,)"), *GOOD.cases[1:]),
        {("FAIL", "status", 1)},
        False,
    ),  # the status says it; no tensor_dropped noise on top
    (
        "headroom regression",
        sweep(result(1, out=0.2, lse=0.1, dq=0.3, dk=0.25, dv=0.45), *GOOD.cases[1:]),
        {("FAIL", "headroom", 1)},
        False,
    ),
    (
        "within noise",
        sweep(
            result(1, out=0.26, lse=0.15, dq=0.35, dk=0.3, dv=0.3),
            result(2, out=0.09, dq=0.1, dk=0.05, dv=0.0),
            *GOOD.cases[2:],
        ),
        set(),
        True,
    ),
    ("new case", sweep(*GOOD.cases, result(5, out=0.3, dq=0.3, dk=0.3, dv=0.3)), {("WARN", "new_case", 5)}, True),
    (
        "removed case (same suite: truncated results)",
        sweep(*GOOD.cases[:3]),
        {("INCONCLUSIVE", "removed_case", 4)},
        False,
    ),
    ("removed case (suite changed)", sweep(*GOOD.cases[:3], suite_hash="h2"), {("WARN", "removed_case", 4)}, True),
    (
        "newly skipped",
        sweep(*GOOD.cases[:3], result(4, "SKIP", "the kernel takes no softcap")),
        {("INCONCLUSIVE", "newly_skipped", 4)},
        False,
    ),
    (
        "large improvement",
        sweep(*GOOD.cases[:3], result(4, out=0.6, dq=0.5, dk=0.3, dv=0.5)),
        {("WARN", "improvement", 4)},
        True,
    ),
    (
        "lse dropped",
        sweep(result(1, out=0.2, dq=0.3, dk=0.25, dv=0.22), *GOOD.cases[1:]),
        {("INCONCLUSIVE", "tensor_dropped", 1)},
        False,
    ),
    (
        "pass without dv",
        sweep(result(1, out=0.2, lse=0.1, dq=0.3, dk=0.25), *GOOD.cases[1:]),
        {("INCONCLUSIVE", "incomplete_pass", 1)},
        False,
    ),
    ("pass without any tensor", sweep(result(1), *GOOD.cases[1:]), {("INCONCLUSIVE", "incomplete_pass", 1)}, False),
    (
        "all skipped",
        sweep(*(result(n, "SKIP", "no") for n in (1, 2, 3, 4))),
        {
            ("INCONCLUSIVE", "newly_skipped", 1),
            ("INCONCLUSIVE", "newly_skipped", 2),
            ("INCONCLUSIVE", "newly_skipped", 4),
            ("INCONCLUSIVE", "nothing_measured", 0),
        },
        False,
    ),
]


@pytest.mark.parametrize("name, current, expected, passes", CURRENT_TABLE, ids=[row[0] for row in CURRENT_TABLE])
def test_compare_table(name, current, expected, passes):
    findings = compare(Baseline.from_sweep(BASE), current, CFG)
    want = {(sev, rule, case(n).id if n else "") for sev, rule, n in expected}
    assert rules_of(findings) == want
    verdict = decide(findings)
    assert verdict.passed == passes and verdict.exit_code == (0 if passes else 1)
    assert verdict.headline.startswith("PASS" if passes else "FAIL")


def test_every_passing_case_gets_one_ok_row():
    findings = compare(Baseline.from_sweep(GOOD), GOOD, CFG)
    ok = [f.case_id for f in findings if f.severity is Severity.OK]
    assert sorted(ok) == sorted(case(n).id for n in (1, 2, 4))


def test_a_filtered_run_does_not_report_unrun_cases_as_removed():
    filtered = sweep(GOOD.cases[0], scope="s1-")
    findings = compare(Baseline.from_sweep(GOOD), filtered, CFG, scope=Scope("s1-"))
    assert not rules_of(findings)
    assert any(f.rule == "out_of_scope" and "3 baseline cases" in f.message for f in findings)
    # without the scope the same run loses three cases, and that blocks
    removed = [f for f in compare(Baseline.from_sweep(GOOD), filtered, CFG) if f.rule == "removed_case"]
    assert len(removed) == 3 and all(f.severity is Severity.INCONCLUSIVE for f in removed)


def test_a_filtered_run_missing_a_case_of_its_scope_is_inconclusive():
    """--only 's[12]-' ran case 1 only: case 2 matches the scope, so its result is missing data."""
    findings = compare(Baseline.from_sweep(GOOD), sweep(GOOD.cases[0]), CFG, scope=Scope("s[12]-"))
    assert rules_of(findings) == {("INCONCLUSIVE", "removed_case", case(2).id)}
    assert not decide(findings).passed


@pytest.mark.parametrize("ids, twice", [((1, 2, 3), None), ((1, 2, 1), [1]), ((1, 2, 2, 1, 3), [1, 2])])
def test_duplicate_case_ids_are_refused_naming_the_file(ids, twice):
    run = sweep(*(result(n, out=0.1, dq=0.1, dk=0.1, dv=0.1) for n in ids))
    if twice is None:
        refuse_duplicate_cases(run, "r.json")
        return
    with pytest.raises(UserError) as err:
        refuse_duplicate_cases(run, "r.json")
    message = str(err.value)
    assert message.startswith(f"r.json: {len(twice)} case ids appear more than once")
    assert all(case(n).id in message for n in twice) and "attn-gate sweep --kernel k --suite smoke" in message


def test_environment_drift_warns_but_passes():
    env = {**ENV, "torch": "2.14.0", "kernel_version": "2"}
    drifted = sweep(*GOOD.cases, env=env)
    findings = compare(Baseline.from_sweep(GOOD), drifted, CFG)
    assert rules_of(findings) == {("WARN", "env_drift", "")}
    assert {f.metric for f in findings if f.rule == "env_drift"} == {"env:torch", "env:kernel_version"}
    assert decide(findings).passed
    assert compare_environment(Environment.from_dict(ENV), Environment.from_dict(ENV)) == []


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "change, words",
    [
        (
            {"env": {**ENV, "gpu_class": "h200"}},
            ["GPU class 'cpu'", "'h200'", "never compares", "attn-gate baseline update"],
        ),
        ({"suite_hash": "h2"}, ["changed since the baseline", "h1 -> h2", "attn-gate baseline update"]),
        ({"tolerance": {"mult_out": 3.0, "mult_dq": 3.0}}, ["mult_out", "not comparable", "attn-gate baseline update"]),
    ],
)
def test_check_comparable_refuses(change, words):
    other = sweep(*GOOD.cases, **change)
    with pytest.raises(UserError) as err:
        check_comparable(Baseline.from_sweep(GOOD), other, "baselines/cpu/k-smoke.json")
    message = str(err.value)
    assert message.startswith("baselines/cpu/k-smoke.json: ")
    for w in words:
        assert w in message, message
    check_comparable(Baseline.from_sweep(GOOD), GOOD, "x")  # the same run is comparable


def test_findings_json_and_ordering():
    findings = compare(Baseline.from_sweep(BASE), CURRENT_TABLE[1][1], CFG)
    verdict = decide(findings, {"headroom_factor": 1.5})
    data = verdict.to_dict()
    assert data["schema_version"] == 3 and data["verdict"] == "FAIL" and data["exit_code"] == 1
    assert data["thresholds"] == {"headroom_factor": 1.5}
    ranks = [Severity(f["severity"]).rank for f in data["findings"]]
    assert ranks == sorted(ranks, reverse=True)  # worst first
    assert [Finding.from_dict(f) for f in data["findings"]] == list(verdict.findings)


def test_inconclusive_blocks_like_fail():
    f = Finding("speed", Severity.INCONCLUSIVE, "c", Subject.speed("bwd"), 1.0, None, 0.03, "too noisy")
    assert not decide([f]).passed and decide([f]).exit_code == 1
    assert decide([Finding("new_case", Severity.WARN, "c", STATUS, None, None, None, "look")]).passed


def test_verdict_modules_import_no_torch():
    code = "import sys, gate.compare.sweep_rules, gate.compare.findings, gate.compare.baselines, gate.report.check_report; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_a_baseline_remembers_the_cudnn_version_and_a_new_one_warns():
    """cuDNN is SDPA-cuDNN's kernel and the default speed anchor: the baseline keeps its version,
    so the same cuDNN is silent and another one is an env-drift warning (not an 'unrecorded' note)."""
    base = sweep(*GOOD.cases, env={**ENV, "cudnn": "91002"})
    baseline = Baseline.from_sweep(base)
    assert baseline.environment["cudnn"] == "91002"

    def env_findings(run):
        return {(f.severity, f.rule, f.metric) for f in compare(baseline, run, CFG) if f.metric.startswith("env:")}

    assert env_findings(base) == set()
    assert env_findings(sweep(*GOOD.cases, env={**ENV, "cudnn": "91900"})) == {
        (Severity.WARN, "env_drift", "env:cudnn")
    }


def _half_finding(rule, severity, case_id="c"):
    subject = Subject.speed("fwd") if rule == "speed" else Subject.ratio("dq")
    return Finding(rule, severity, case_id, subject, 0.1, 0.2, 1.0, f"{case_id}: {rule}")


@pytest.mark.parametrize(
    "found, correctness, speed",
    [
        ([], Severity.OK, Severity.OK),
        ([("tolerance", Severity.FAIL)], Severity.FAIL, Severity.OK),
        ([("speed", Severity.FAIL)], Severity.OK, Severity.FAIL),
        ([("speed", Severity.INCONCLUSIVE), ("tolerance", Severity.WARN)], Severity.OK, Severity.INCONCLUSIVE),
        ([("tensor_dropped", Severity.INCONCLUSIVE), ("tolerance", Severity.FAIL)], Severity.FAIL, Severity.OK),
        ([("tensor_dropped", Severity.INCONCLUSIVE), ("speed", Severity.OK)], Severity.INCONCLUSIVE, Severity.OK),
    ],
)
def test_decide_returns_both_halves_each_with_its_own_severity(found, correctness, speed):
    verdict = decide([_half_finding(rule, sev, f"c{i}") for i, (rule, sev) in enumerate(found)])
    assert (verdict.correctness.severity, verdict.speed.severity) == (correctness, speed)
    assert verdict.passed == (verdict.correctness.passed and verdict.speed.passed)
    assert set(verdict.correctness.findings) | set(verdict.speed.findings) == set(verdict.findings)


def test_a_half_counts_failed_and_inconclusive_cases_apart():
    half = decide(
        [
            _half_finding("tolerance", Severity.FAIL, "a"),
            _half_finding("tensor_dropped", Severity.INCONCLUSIVE, "a"),
            _half_finding("tensor_dropped", Severity.INCONCLUSIVE, "b"),
            _half_finding("speed", Severity.FAIL, "s"),
        ]
    ).correctness
    assert half.failed_cases == {"a"} and half.inconclusive_cases == {"b"}


def test_a_finding_carries_its_rule_subject_and_advice_typed():
    f = Finding(
        "improvement",
        Severity.WARN,
        "c",
        Subject.ratio("dv"),
        0.4,
        0.1,
        0.2,
        **advised("c: dv improved", "; refresh the baseline"),
    )
    assert (
        f.rule is Rule.IMPROVEMENT
        and f.subject == Subject(Quantity.RATIO, "dv")
        and f.advice is Advice.REFRESH_BASELINE
    )
    assert (f.metric, f.message, f.unadvised) == ("ratio:dv", "c: dv improved; refresh the baseline", "c: dv improved")
    assert Finding.from_dict(f.to_dict()).subject == f.subject and f.to_dict()["rule"] == "improvement"
    assert [str(s) for s in (STATUS, Subject.env("torch"), Subject.speed("fwd"))] == [
        "status",
        "env:torch",
        "speed_ratio:fwd",
    ]
    assert [Subject.parse(str(s)) for s in (STATUS, Subject.env("torch"))] == [STATUS, Subject.env("torch")]


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"rule": "no_such_rule"}, ValueError),  # a rule nobody declared
        ({"subject": "ratio:dq"}, TypeError),  # a subject as a string to be split later
        ({"advice": Advice.REFRESH_BASELINE, "statement": ""}, ValueError),  # advice with no statement to fall back on
        ({"advice": Advice.REFRESH_BASELINE, "statement": "other text"}, ValueError),  # a statement the message lacks
    ],
)
def test_a_finding_refuses_untyped_or_inconsistent_fields(kwargs, error):
    fields = dict(
        rule="tolerance",
        severity=Severity.FAIL,
        case_id="c",
        subject=Subject.ratio("dq"),
        baseline=None,
        current=2.0,
        threshold=1.0,
        message="c: dq error is 2 x its bound",
    )
    with pytest.raises(error):
        Finding(**{**fields, **kwargs})
    assert Finding(**fields).rule is Rule.TOLERANCE
