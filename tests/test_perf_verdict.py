"""The speed rule, table-tested on synthetic per-round ratios (no timing, no torch)."""

import pytest

from gate.core.config import PerfConfig
from gate.speed.rule import PerfRules, PerfSeverity, RatioEstimate, judge

RULES = PerfRules(regression_pct=2.0, noise_k=3.0, improvement_pct=10.0, alpha=0.01, min_rounds=7, max_noise_pct=5.0)


def rounds(center: float, jitter: float = 0.002, n: int = 15) -> RatioEstimate:
    """n deterministic per-round ratios spread evenly over center * (1 +- jitter)."""
    xs = [center * (1 + jitter * (((i * 7) % n) / (n - 1) * 2 - 1)) for i in range(n)]
    return RatioEstimate.from_samples(xs)


BASE = rounds(1.0)

TABLE = [
    # id, current, confirm, expected severity, expected suspected
    ("unchanged", rounds(1.0), None, PerfSeverity.OK, False),
    ("significant-but-small", rounds(1.01), None, PerfSeverity.OK, False),
    ("large-but-noisy", rounds(1.15, jitter=0.6), None, PerfSeverity.INCONCLUSIVE, False),
    ("too-few-rounds", rounds(1.5, n=5), None, PerfSeverity.INCONCLUSIVE, False),
    ("clear-regression-unconfirmed", rounds(1.10), None, PerfSeverity.FAIL, True),
    ("clear-regression-confirmed", rounds(1.10), rounds(1.09, n=45), PerfSeverity.FAIL, True),
    ("regression-not-confirmed", rounds(1.10), rounds(1.0, n=45), PerfSeverity.OK, True),
    ("improvement", rounds(0.85), None, PerfSeverity.WARN, False),
    ("small-improvement", rounds(0.95), None, PerfSeverity.OK, False),
]


@pytest.mark.parametrize("current,confirm,severity,suspected", [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_rule_table(current, confirm, severity, suspected):
    j = judge("case", "bwd", BASE, current, RULES, confirm=confirm)
    assert (j.severity, j.suspected) == (severity, suspected), j.message
    assert j.metric == "speed_ratio:bwd"


def test_confirmed_failure_reports_both_measurements():
    j = judge("case", "fwd", BASE, rounds(1.10), RULES, confirm=rounds(1.08, n=45))
    assert j.confirmed is True
    assert j.change == pytest.approx(0.08, abs=0.002) and j.first_change == pytest.approx(0.10, abs=0.002)
    assert "confirmed" in j.message


def test_threshold_is_the_larger_of_pct_and_k_times_noise():
    quiet = judge("c", "fwd", BASE, rounds(1.01), RULES)
    assert quiet.threshold == pytest.approx(0.02)  # noise tiny: the configured 2% rules
    noisy = judge("c", "fwd", rounds(1.0, 0.04), rounds(1.035, 0.04), RULES)
    assert noisy.threshold == pytest.approx(3.0 * noisy.noise) and noisy.threshold > 0.02
    assert noisy.severity is PerfSeverity.OK  # 3.5% inside a ~4% noise band is not a regression


def test_same_change_fails_with_a_tight_baseline_and_not_with_a_loose_threshold():
    strict = judge("c", "fwd", BASE, rounds(1.03), RULES)
    lax = judge("c", "fwd", BASE, rounds(1.03), PerfRules(regression_pct=5.0))
    assert strict.severity is PerfSeverity.FAIL and lax.severity is PerfSeverity.OK


def test_sign_test_used_when_baseline_kept_no_samples():
    bare = RatioEstimate(median=1.0, noise=0.001, n=15)
    assert judge("c", "fwd", bare, rounds(1.10), RULES).severity is PerfSeverity.FAIL
    assert judge("c", "fwd", bare, rounds(1.0), RULES).severity is PerfSeverity.OK


def test_missing_baseline_or_measurement_is_inconclusive_never_pass():
    assert judge("c", "fwd", None, rounds(1.0), RULES).severity is PerfSeverity.INCONCLUSIVE
    assert judge("c", "fwd", BASE, None, RULES).severity is PerfSeverity.INCONCLUSIVE
    assert judge("c", "fwd", BASE, rounds(1.0), RULES).severity is PerfSeverity.OK


NAN, INF = float("nan"), float("inf")


def with_samples(est: RatioEstimate, *bad: float) -> RatioEstimate:
    """`est` with its first samples replaced (median and noise kept: as a hand-edited baseline would)."""
    return RatioEstimate(median=est.median, noise=est.noise, n=est.n, samples=bad + est.samples[len(bad):])


NON_FINITE = [
    # id, baseline, current, expected severity, words in the message
    ("baseline-nan-sample", with_samples(BASE, NAN), rounds(1.10), PerfSeverity.INCONCLUSIVE, "baseline"),
    ("baseline-nan-sample-no-change", with_samples(BASE, NAN), rounds(1.0), PerfSeverity.INCONCLUSIVE, "baseline"),
    ("baseline-inf-sample", with_samples(BASE, INF), rounds(1.0), PerfSeverity.INCONCLUSIVE, "baseline"),
    ("baseline-nan-median", RatioEstimate(median=NAN, noise=0.001, n=15, samples=BASE.samples), rounds(1.0),
     PerfSeverity.INCONCLUSIVE, "baseline"),
    ("current-nan-sample", BASE, with_samples(rounds(1.10), NAN, NAN), PerfSeverity.INCONCLUSIVE, "this run"),
    ("all-finite", BASE, rounds(1.10), PerfSeverity.FAIL, "slower"),
]


@pytest.mark.parametrize("baseline,current,severity,words", [t[1:] for t in NON_FINITE], ids=[t[0] for t in NON_FINITE])
def test_nan_or_infinite_ratios_are_inconclusive_with_a_reason(baseline, current, severity, words):
    j = judge("c", "fwd", baseline, current, RULES)
    assert j.severity is severity, j.message
    assert words in j.message
    if severity is PerfSeverity.INCONCLUSIVE:
        assert "NaN" in j.message or "not a positive number" in j.message


def test_nan_samples_from_a_baseline_file_are_inconclusive_not_a_traceback():
    entry = {**BASE.to_dict(), "samples": ["nan"] + list(BASE.samples[1:])}  # as JSON could hold it
    j = judge("c", "bwd", RatioEstimate.from_dict(entry), rounds(1.10), RULES)
    assert j.severity is PerfSeverity.INCONCLUSIVE and "1 of 15 per-round ratios are NaN" in j.message


def test_rule_defaults_are_the_config_defaults():
    assert PerfRules() == PerfRules.from_config(PerfConfig())
    assert PerfRules().regression_pct == PerfConfig().regression_pct == 2.0


def test_estimate_round_trips_through_dict():
    est = rounds(1.2)
    assert RatioEstimate.from_dict(est.to_dict()) == est
