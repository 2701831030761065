"""The mean-error rule: a tensor fails when its mean error exceeds mean_mult x the in-dtype
reference's mean error + the mean floor (gate/correctness/tolerance.py). Pure tables first (no
torch), then a results file written before the rule, then the planted bias it alone catches."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import re
from pathlib import Path

import pytest

from gate.compare.baselines import Baseline
from gate.compare.diagnosis import diagnose
from gate.compare.findings import Rule, Severity, decide
from gate.compare.sweep_rules import compare, refuse_unjudged_by_mean, rule_mean_error
from gate.core.cases import Case
from gate.core.config import ToleranceConfig, VerdictConfig
from gate.core.errors import UserError
from gate.core.identity import Scope
from gate.core.results import MEAN_FIELDS, CaseResult, Status, SweepResult, TensorError, error_ratio
from gate.correctness.tolerance import MEAN_FLOOR_SHARE, error_bound, mean_floor

DATA = Path(__file__).parent / "data"


def judged(name: str = "out", ratio: float = 0.5, mean_ratio: float = 0.5, seed: int = 0) -> TensorError:
    """A tensor with both rules' numbers consistent: the max at `ratio`, the mean at `mean_ratio`."""
    pt_mean, floor = 1e-4, 2e-4
    m_floor = mean_floor(floor)
    m_bound = error_bound(pt_mean, m_floor, 1.5)
    return TensorError(
        tensor=name,
        max_err=ratio * 0.01,
        mean_err=mean_ratio * m_bound,
        pt_err=(0.01 - floor) / 2.0,
        floor=floor,
        mult=2.0,
        bound=0.01,
        ratio=error_ratio(ratio * 0.01, 0.01),
        worst_index=(0,),
        band_atol=5e-3,
        band_rtol=5e-3,
        band_ok=True,
        seed=seed,
        pt_mean_err=pt_mean,
        mean_mult=1.5,
        mean_floor=m_floor,
        mean_bound=m_bound,
        mean_ratio=error_ratio(mean_ratio * m_bound, m_bound),
    )


def case(n: int) -> Case:
    return Case.build(batch=1, seqlen_q=n, seqlen_k=n, heads_q=1, heads_kv=1, head_dim=8, head_dim_v=8, dtype="bf16")


def row(n: int, out_mean: float = 0.5, status: str | None = None) -> CaseResult:
    tensors = (judged("out", 0.4, out_mean),) + tuple(judged(t, 0.3, 0.3) for t in ("dq", "dk", "dv"))
    passed = all(t.passed for t in tensors)
    return CaseResult(case=case(n), status=Status(status or ("PASS" if passed else "FAIL")), tensors=tensors)


def sweep(*rows: CaseResult) -> SweepResult:
    return SweepResult(
        kernel="k",
        suite="smoke",
        suite_hash="h1",
        environment={"gpu_class": "cpu", "device": "cpu"},
        cases=rows,
        tolerance=ToleranceConfig().as_dict(),
        started_at="2026-01-01T00:00:00+00:00",
        wall_s=1.0,
        scope=Scope(),
    )


# ---------------------------------------------------------------- the arithmetic and the tensor


def test_the_mean_floor_is_a_share_of_the_rounding_floor_plus_the_whole_allowance():
    assert mean_floor(8e-3) == MEAN_FLOOR_SHARE * 8e-3 and 0 < MEAN_FLOOR_SHARE < 1
    assert mean_floor(8e-3, 2.0**-12) == MEAN_FLOOR_SHARE * 8e-3 + 2.0**-12
    assert error_bound(1e-4, 5e-5, 1.5) == pytest.approx(2e-4)


@pytest.mark.parametrize(
    "ratio, mean_ratio, passes, says",
    [
        (0.5, 0.5, True, ()),
        (0.5, 1.0, True, ()),  # at the mean bound is within it
        (0.5, 1.2, False, ("out mean error", "> mean bound", "(mean ratio 1.20, seed 3)")),
        (0.5, math.inf, False, ("mean ratio inf",)),  # a NaN error is written as inf: fails
        (1.5, 0.5, False, ("out error 0.015 > bound 0.01 (ratio 1.50, seed 3)",)),
        (1.5, 2.0, False, ("(ratio 1.50, seed 3); out mean error",)),  # both rules, both said
    ],
)
def test_a_tensor_passes_only_within_both_bounds_and_says_which_it_breaks(ratio, mean_ratio, passes, says):
    t = judged("out", ratio, mean_ratio, seed=3)
    assert t.passed is passes and t.mean_judged
    assert (t.failure == "") is passes
    for words in says:
        assert words in t.failure, t.failure


def test_a_tensor_recorded_before_the_rule_is_not_judged_by_it():
    t = dataclasses.replace(judged("out", 0.5, 5.0), **dict.fromkeys(MEAN_FIELDS))
    assert not t.mean_judged and t.within_mean and t.passed


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(mean_bound=1.0), "mean_bound = 1.0 is not mean_mult x pt_mean_err + mean_floor"),
        (dict(mean_ratio=0.01), "mean_ratio = 0.01 is not mean_err / mean_bound"),
        (dict(mean_floor=0.0, mean_bound=1.5e-4, mean_ratio=0.1), "must be > 0"),
    ],
)
def test_a_stored_mean_ratio_is_recomputed_from_its_numbers(change, words):
    data = dataclasses.replace(judged(), **change).to_dict()
    with pytest.raises(ValueError, match=re.escape(words)):
        TensorError.from_dict(data)


def test_mean_fields_are_all_numbers_or_all_null_and_never_absent():
    data = judged().to_dict()
    assert TensorError.from_dict(data) == judged()
    with pytest.raises(ValueError, match="all numbers or all null"):
        TensorError.from_dict({**data, "mean_ratio": None})
    with pytest.raises(ValueError, match="out.pt_mean_err is missing"):
        TensorError.from_dict({k: v for k, v in data.items() if k != "pt_mean_err"})
    with pytest.raises(ValueError, match="out.mean_ratio"):
        TensorError.from_dict({**data, "mean_ratio": "nan"})


def test_a_pass_row_over_its_mean_bound_is_refused():
    bad = row(1, out_mean=1.5, status="PASS")
    with pytest.raises(ValueError, match=r"status PASS contradicts the row: out over the bound \(mean ratio 1.5"):
        CaseResult.from_dict(bad.to_dict())
    assert CaseResult.from_dict(row(1, out_mean=1.5).to_dict()).status is Status.FAIL


# ---------------------------------------------------------------- the finding


@pytest.mark.parametrize(
    "mean_ratio, fails",
    [(None, False), (0.0, False), (1.0, False), (1.0001, True), (4.0, True), (math.inf, True), (math.nan, True)],
)
def test_rule_mean_error(mean_ratio, fails):
    f = rule_mean_error("c", "out", mean_ratio, 0.9)
    # over its max bound the tensor is rule_tolerance's FAIL: not said twice
    assert rule_mean_error("c", "out", mean_ratio, 1.5) is None and rule_mean_error("c", "out", 4.0, math.nan) is None
    assert (f is not None and f.severity is Severity.FAIL) == fails, f
    if fails:
        assert f.rule is Rule.MEAN_ERROR and f.metric == "mean_ratio:out" and f.threshold == 1.0
        assert f.message.startswith("c: out mean error is ") and "x its mean bound (must be <= 1)" in f.message


def test_a_bias_under_the_max_bound_fails_the_check_by_the_mean_rule_alone():
    good = sweep(row(1), row(2))
    biased = sweep(row(1, out_mean=2.5), row(2))
    assert all(t.ratio <= 1 for t in biased.cases[0].tensors)  # the max rule alone passes it
    assert decide(compare(Baseline.from_sweep(good), good, VerdictConfig())).passed
    found = compare(Baseline.from_sweep(good), biased, VerdictConfig())
    verdict = decide(found)
    failing = {(f.rule, f.case_id) for f in found if f.severity is Severity.FAIL}
    assert failing == {(Rule.MEAN_ERROR, case(1).id), (Rule.STATUS, case(1).id)}
    assert not verdict.passed and f"{case(1).id}: out mean error is 2.5 x its mean bound" in verdict.headline
    # in the baseline it was a FAIL: the rule is of the run alone and still fails
    again = compare(Baseline.from_sweep(biased), biased, VerdictConfig())
    assert any(f.rule is Rule.MEAN_ERROR and f.severity is Severity.FAIL for f in again)


def test_a_known_failure_on_the_tensor_covers_its_mean_failure():
    from gate.compare.known import failures_of

    assert failures_of(row(1, out_mean=2.5)) == frozenset({"out"})
    assert failures_of(row(1)) == frozenset()


# ---------------------------------------------------------------- a results file from before the rule


def version_3_payload(tmp_path) -> dict:
    """A results file as version 3 wrote it: this code's layout without the five mean fields."""
    payload = sweep(row(1), row(2)).to_dict()
    for r in payload["cases"]:
        for t in r["tensors"].values():
            for k in MEAN_FIELDS:
                del t[k]
    return {**payload, "schema_version": 3}


def test_a_version_3_file_reads_with_its_tensors_unjudged_by_the_mean_rule(tmp_path):
    path = tmp_path / "v3.json"
    path.write_text(json.dumps(version_3_payload(tmp_path), sort_keys=True))  # as files are written
    old = SweepResult.read(path)
    assert all(not t.mean_judged for c in old.cases for t in c.tensors)
    assert old.unjudged_by_mean == (case(1).id, case(2).id)
    again = tmp_path / "v4.json"
    old.write(again)  # written back as version 4, the fields null: still unjudged, never invented
    data = json.loads(again.read_text())
    assert data["schema_version"] == 4 and data["cases"][0]["tensors"]["out"]["mean_ratio"] is None
    assert SweepResult.read(again) == old
    assert SweepResult.read(tmp_path / "v4.json").unjudged_by_mean


@pytest.mark.parametrize("name", ["cpu-sweep-sdpa-cpu-smoke.json.gz", "h200-sweep-sdpa-flash-pr.json.gz"])
def test_the_commands_that_judge_stored_rows_refuse_a_file_from_before_the_rule(name, tmp_path):
    """Fail closed: a bias under the max bound would PASS in such a file, so check --results,
    baseline update --from-results and merge (all through read_results) refuse it in one line."""
    from gate.workflow.check import read_results

    path = tmp_path / "old.json"
    path.write_bytes(gzip.decompress((DATA / name).read_bytes()))
    with pytest.raises(UserError) as err:
        read_results(path, None, None)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and "before the mean-error rule" in message and "\n" not in message
    assert "re-run the sweep with `attn-gate sweep --kernel" in message


def test_a_file_of_this_version_is_judged_not_refused(tmp_path):
    from gate.workflow.check import read_results

    path = tmp_path / "v4.json"
    sweep(row(1), row(2, out_mean=3.0)).write(path)
    run = read_results(path, None, None)
    refuse_unjudged_by_mean(run, path)
    assert [c.status for c in run.cases] == [Status.PASS, Status.FAIL]


# ---------------------------------------------------------------- the setting


def test_mean_mult_is_a_declared_setting_with_a_range():
    tol = ToleranceConfig()
    assert (tol.mean_mult, tol.mean_mult_fp8) == (1.5, 3.0)
    assert tol.mean_mult_of("bf16", "bf16") == 1.5 and tol.mean_mult_of("e4m3", "bf16") == 3.0
    assert tol.mean_mult_of("fp32", "fp32") == 1.5 * tol.fp32_factor  # as the max rule's multipliers
    assert tol.mean_mult_of("bf16", "fp32") == 1.5 * tol.fp32_factor  # the LSE's float32 yardstick
    for bad in (0.5, 11.0, math.nan):
        with pytest.raises(ValueError, match=r"mean_mult = .* must be a number in \[1, 10\]"):
            ToleranceConfig(mean_mult=bad)


def test_the_reports_name_the_mean_failure_not_a_passing_max_ratio():
    from gate.report.comment import pr_comment
    from gate.report.failures import check_lines

    good = sweep(row(1), row(2))
    biased = sweep(row(1, out_mean=2.5), row(2))
    found = compare(Baseline.from_sweep(good), biased, VerdictConfig())
    (line,) = check_lines(found, {c.case_id: c for c in biased.cases})
    assert line.text == f"FAIL {case(1).id}  out mean error 2.5x its mean bound"
    verdict = decide(found)
    comment = pr_comment(verdict, diagnose(verdict, biased), biased, Baseline.from_sweep(good))
    assert f"| FAIL | `{case(1).id}` | out mean error / mean bound (FAIL) | - | 2.5 x | - | 1 x |" in comment


# ---------------------------------------------------------------- the planted bias only this rule sees

# A smoke case with large outputs (a dense fp32 bias makes rows peaky): there half an ulp of bias on
# out is over the mean bound (measured mean ratio ~1.06 on both CPU kernels) and far under the max one
BIASED_CASE = "bf16-b2-h4-s97x130-d64-bias.dense.fp32"


@pytest.mark.parametrize("host", ["sdpa-cpu", "tiled"])
def test_the_planted_bias_passes_the_max_rule_and_dies_by_the_mean_rule(host):
    from gate.core.cases import load_suite
    from gate.correctness.planted import BUGS, planted_adapter
    from gate.correctness.run_case import run_case
    from gate.kernels.registry import get_adapter

    tol = ToleranceConfig()
    c = next(c for c in load_suite("smoke").cases if c.id == BIASED_CASE)
    bug = next(b for b in BUGS if b.name == "out_bias_half_ulp")
    assert bug.trigger.applies(c)
    clean = run_case(get_adapter(host), c, "cpu", tol)
    assert clean.status is Status.PASS and clean.tensor("out").mean_ratio < 0.5, clean.reason
    planted = planted_adapter(bug, get_adapter(host))
    biased = run_case(planted, c, "cpu", tol)
    out = biased.tensor("out")
    assert all(t.within_max for t in biased.tensors) and out.ratio < 0.8  # the max rule alone passes it
    assert biased.status is Status.FAIL and not out.within_mean and out.mean_ratio > 1, biased.reason
    assert biased.reason.startswith("out mean error") and "mean ratio" in biased.reason
    # the mean rule at the top of its range adds nothing: the bias survives
    assert run_case(planted, c, "cpu", ToleranceConfig(mean_mult=10.0)).status is Status.PASS


BIASED_SUITE = """
[tool.attn-gate.suites.biased]
seeds = [0, 1]
[[tool.attn-gate.suites.biased.matrix]]
dtype = ["bf16"]
seqlens = ["97x130"]
heads = ["4"]
head_dims = ["64"]
bias = ["dense"]
bias_dtype = ["fp32"]
"""


def test_the_selftest_kills_the_planted_bias_by_the_mean_rule(tmp_path, capsys):
    from gate.commands.main import main

    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.attn-gate]\n" + BIASED_SUITE)
    out = tmp_path / "out"
    args = ["--suite", "biased", "--config", str(config), "--out", str(out), "--bugs", "out_bias_half_ulp"]
    code = main(["selftest", "--device", "cpu", *args, "--no-slowdowns"])
    report = json.loads((out / "selftest.json").read_text())
    assert code == 0, capsys.readouterr()
    (bug,) = report["bugs"]
    assert bug["status"] == "KILLED" and bug["case_id"] == BIASED_CASE, bug
    assert bug["rule"] == "mean_error" and bug["metric"] == "mean_ratio:out" and bug["ratio"] > 1, bug
