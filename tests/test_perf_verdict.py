"""The speed rule, table-tested on synthetic per-round ratios (no timing, no torch)."""

import dataclasses
import re

import numpy as np
import pytest

from gate.core.config import PerfConfig
from gate.speed.rule import PerfRules, PerfSeverity, RatioEstimate, change_text, judge

RULES = PerfRules(regression_pct=2.0, noise_k=3.0, improvement_pct=10.0, alpha=0.05, min_rounds=7, max_noise_pct=5.0)
CPU_RULES = PerfRules.from_config(PerfConfig(), "cpu")  # cpu_regression_pct: 25%


def rounds(center: float, jitter: float = 0.002, n: int = 15) -> RatioEstimate:
    """n deterministic per-round ratios spread evenly over center * (1 +- jitter)."""
    xs = [center * (1 + jitter * (((i * 7) % n) / (n - 1) * 2 - 1)) for i in range(n)]
    return RatioEstimate.from_samples(xs)


def noisy_rounds(center: float, noise: float, n: int, seed: int) -> RatioEstimate:
    """n per-round ratios with `noise` relative spread (lognormal sigma) and a heavy right tail
    (every fifth round 1.5x slower: a context switch), as a shared 2-core CPU gives them."""
    rng = np.random.default_rng(seed)
    xs = center * rng.lognormal(0.0, noise, n)
    xs[::5] *= 1.5
    return RatioEstimate.from_samples(xs)


BASE = rounds(1.0)
CPU_BASE = noisy_rounds(0.5, 0.2, 30, seed=1)

TABLE = [
    # id, rules, baseline, current, confirm, expected severity, expected suspected
    ("unchanged", RULES, BASE, rounds(1.0), None, PerfSeverity.OK, False),
    ("small-slowdown-inside-the-limit", RULES, BASE, rounds(1.01), None, PerfSeverity.OK, False),
    ("straddles-the-limit", RULES, BASE, rounds(1.02, jitter=0.01), None, PerfSeverity.INCONCLUSIVE, False),
    ("large-but-noisy-straddles", RULES, BASE, rounds(1.15, jitter=0.6), None, PerfSeverity.INCONCLUSIVE, False),
    ("too-few-rounds", RULES, BASE, rounds(1.5, n=5), None, PerfSeverity.INCONCLUSIVE, False),
    ("clear-regression-unconfirmed", RULES, BASE, rounds(1.10), None, PerfSeverity.FAIL, True),
    ("clear-regression-confirmed", RULES, BASE, rounds(1.10), rounds(1.09, n=45), PerfSeverity.FAIL, True),
    ("regression-not-confirmed", RULES, BASE, rounds(1.10), rounds(1.0, n=45), PerfSeverity.OK, True),
    (
        "straddle-settled-by-the-re-run",
        RULES,
        BASE,
        rounds(1.02, jitter=0.01),
        rounds(1.0, n=45),
        PerfSeverity.OK,
        False,
    ),
    ("improvement", RULES, BASE, rounds(0.85), None, PerfSeverity.WARN, False),
    ("small-improvement", RULES, BASE, rounds(0.95), None, PerfSeverity.OK, False),
    # a shared 2-core CPU: 20% noise per round and a heavy tail, 15 rounds against a 30-round baseline
    (
        "cpu-3x-slower-with-20pct-noise",
        CPU_RULES,
        CPU_BASE,
        noisy_rounds(1.5, 0.2, 15, seed=2),
        None,
        PerfSeverity.FAIL,
        True,
    ),
    (
        "cpu-3x-slower-confirmed",
        CPU_RULES,
        CPU_BASE,
        noisy_rounds(1.5, 0.2, 15, seed=2),
        noisy_rounds(1.5, 0.2, 30, seed=3),
        PerfSeverity.FAIL,
        True,
    ),
    (
        "cpu-unchanged-with-20pct-noise",
        CPU_RULES,
        CPU_BASE,
        noisy_rounds(0.5, 0.2, 15, seed=4),
        None,
        PerfSeverity.OK,
        False,
    ),
    (
        "cpu-drift-of-minus-20pct-is-no-warning",
        CPU_RULES,
        CPU_BASE,
        noisy_rounds(0.4, 0.05, 15, seed=5),
        None,
        PerfSeverity.OK,
        False,
    ),
    ("cpu-2x-faster-warns", CPU_RULES, CPU_BASE, noisy_rounds(0.25, 0.05, 15, seed=5), None, PerfSeverity.WARN, False),
    (
        "cpu-unchanged-at-the-gpu-limit-is-not-a-fail",
        RULES,
        CPU_BASE,
        noisy_rounds(0.5, 0.2, 15, seed=4),
        None,
        PerfSeverity.INCONCLUSIVE,
        False,
    ),
]


@pytest.mark.parametrize(
    "rules,baseline,current,confirm,severity,suspected", [t[1:] for t in TABLE], ids=[t[0] for t in TABLE]
)
def test_rule_table(rules, baseline, current, confirm, severity, suspected):
    j = judge("case", "bwd", baseline, current, rules, confirm=confirm)
    assert (j.severity, j.suspected) == (severity, suspected), j.message
    assert j.metric == "speed_ratio:bwd"
    interval = change_text(j.change, j.ci_low, j.ci_high, j.confidence)
    if interval:  # `bwd +212% [+195%, +230%] (95% CI)` leads the message
        assert j.ci_low <= j.change <= j.ci_high and j.confidence == 0.95
        assert j.message.startswith(f"bwd {interval}")
    else:
        assert "too few rounds" in j.message


def test_the_verdict_follows_where_the_interval_lies():
    """FAIL: the whole interval past the limit; OK: the whole interval within it; else INCONCLUSIVE."""
    for current in (rounds(1.0), rounds(1.03), rounds(1.02, jitter=0.01), rounds(1.10), rounds(1.01, 0.05)):
        j = judge("c", "fwd", BASE, current, RULES)
        expected = (
            PerfSeverity.FAIL
            if j.ci_low > 0.02
            else PerfSeverity.OK
            if j.ci_high <= 0.02
            else PerfSeverity.INCONCLUSIVE
        )
        assert j.severity is expected and j.straddles == (expected is PerfSeverity.INCONCLUSIVE), j.message


def test_a_3x_slower_pass_reads_as_a_factor_with_its_interval():
    j = judge("c", "bwd", rounds(0.5, jitter=0.02), rounds(1.5, jitter=0.05), RULES)
    assert j.change == pytest.approx(2.0, abs=0.01) and 1.9 < j.ci_low < 2.0 < j.ci_high < 2.1
    assert re.fullmatch(r"bwd \+200% \[\+19\d%, \+20\d%\] \(95% CI\): slower, .*", j.message), j.message


def test_confirmed_failure_reports_both_measurements():
    j = judge("case", "fwd", BASE, rounds(1.10), RULES, confirm=rounds(1.08, n=45))
    assert j.confirmed is True
    assert j.change == pytest.approx(0.08, abs=0.002) and j.first_change == pytest.approx(0.10, abs=0.002)
    assert "confirmed by a 45-round re-run (first fwd +10.0% [" in j.message


def test_the_limit_is_the_practical_size_of_the_device():
    assert RULES.confidence == 0.95 and judge("c", "fwd", BASE, rounds(1.01), RULES).threshold == pytest.approx(0.02)
    assert PerfRules.from_config(PerfConfig(), "cuda").regression_pct == 2.0
    assert PerfRules.from_config(PerfConfig(cpu_regression_pct=40.0), "cpu").regression_pct == 40.0


def test_same_change_fails_with_a_tight_limit_and_not_with_a_loose_one():
    strict = judge("c", "fwd", BASE, rounds(1.03), RULES)
    lax = judge("c", "fwd", BASE, rounds(1.03), PerfRules(regression_pct=5.0))
    assert strict.severity is PerfSeverity.FAIL and lax.severity is PerfSeverity.OK


def test_a_wider_confidence_widens_the_interval():
    narrow = judge("c", "fwd", BASE, rounds(1.03, 0.02), PerfRules(alpha=0.2))
    wide = judge("c", "fwd", BASE, rounds(1.03, 0.02), PerfRules(alpha=0.01))
    assert wide.ci_low < narrow.ci_low and wide.ci_high > narrow.ci_high


def test_median_only_baseline_uses_the_current_median_interval():
    bare = RatioEstimate(median=1.0, noise=0.001, n=15)
    assert judge("c", "fwd", bare, rounds(1.10), RULES).severity is PerfSeverity.FAIL
    assert judge("c", "fwd", bare, rounds(1.0), RULES).severity is PerfSeverity.OK


def test_too_few_samples_for_an_interval_fails_closed():
    few = PerfRules(min_rounds=3)
    j = judge("c", "fwd", rounds(1.0, n=3), rounds(3.0, n=3), few)  # 3 vs 3 cannot reach 95%
    assert j.severity is PerfSeverity.INCONCLUSIVE and "no 95% confidence interval from 3 and 3 rounds" in j.message


def test_a_baseline_recorded_as_noisy_says_so():
    noisy = dataclasses.replace(CPU_BASE, noisy=True)
    j = judge("c", "bwd", noisy, noisy_rounds(0.5, 0.2, 15, seed=4), CPU_RULES)
    assert "recorded as noisy" in j.message and "max_noise_pct 5%" in j.message
    assert "recorded as noisy" not in judge("c", "bwd", CPU_BASE, noisy_rounds(0.5, 0.2, 15, seed=4), CPU_RULES).message
    assert RatioEstimate.from_dict(noisy.to_dict()) == noisy and "noisy" not in CPU_BASE.to_dict()


def test_a_noisy_flag_that_is_not_a_boolean_is_refused():
    with pytest.raises(TypeError, match="noisy"):
        RatioEstimate.from_dict({**BASE.to_dict(), "noisy": "yes"})


def test_missing_baseline_or_measurement_is_inconclusive_never_pass():
    assert judge("c", "fwd", None, rounds(1.0), RULES).severity is PerfSeverity.INCONCLUSIVE
    assert judge("c", "fwd", BASE, None, RULES).severity is PerfSeverity.INCONCLUSIVE
    assert judge("c", "fwd", BASE, rounds(1.0), RULES).severity is PerfSeverity.OK


NAN, INF = float("nan"), float("inf")


def with_samples(est: RatioEstimate, *bad: float) -> RatioEstimate:
    """`est` with its first samples replaced (median and noise kept: as a hand-edited baseline would)."""
    return RatioEstimate(median=est.median, noise=est.noise, n=est.n, samples=bad + est.samples[len(bad) :])


NON_FINITE = [
    # id, baseline, current, expected severity, words in the message
    ("baseline-nan-sample", with_samples(BASE, NAN), rounds(1.10), PerfSeverity.INCONCLUSIVE, "baseline"),
    ("baseline-nan-sample-no-change", with_samples(BASE, NAN), rounds(1.0), PerfSeverity.INCONCLUSIVE, "baseline"),
    ("baseline-inf-sample", with_samples(BASE, INF), rounds(1.0), PerfSeverity.INCONCLUSIVE, "baseline"),
    (
        "baseline-nan-median",
        RatioEstimate(median=NAN, noise=0.001, n=15, samples=BASE.samples),
        rounds(1.0),
        PerfSeverity.INCONCLUSIVE,
        "baseline",
    ),
    ("current-nan-sample", BASE, with_samples(rounds(1.10), NAN, NAN), PerfSeverity.INCONCLUSIVE, "this run"),
    ("all-finite", BASE, rounds(1.10), PerfSeverity.FAIL, "slower"),
    ("current-zero-sample", BASE, with_samples(rounds(1.10), 0.0), PerfSeverity.INCONCLUSIVE, "not positive"),
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
