"""Pure statistics on synthetic samples with known answers (no timing, no torch)."""

import math

import pytest

from gate.speed import stats as st


def test_median_and_quantiles_known_values():
    assert st.median([3.0, 1.0, 2.0]) == 2.0
    assert st.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert st.quantile([1, 2, 3, 4, 5], 0.25) == 2.0
    assert st.iqr([1, 2, 3, 4, 5]) == 2.0
    assert math.isnan(st.median([]))


def test_mad_and_median_standard_error():
    xs = [1.0, 2.0, 3.0, 4.0, 100.0]  # an outlier does not move the MAD
    assert st.mad(xs) == 1.0
    se = st.median_rel_se(xs)
    assert se == pytest.approx(math.sqrt(math.pi / 2) * 1.4826 / math.sqrt(5) / 3.0)
    assert math.isnan(st.median_rel_se([1.0]))


NAN = float("nan")
WITH_NAN = [1.0, 2.0, NAN, 4.0, 5.0, 6.0, 7.0]
NAN_IN_NAN_OUT = [
    ("median", lambda: st.median(WITH_NAN)),
    ("quantile", lambda: st.quantile(WITH_NAN, 0.25)),
    ("iqr", lambda: st.iqr(WITH_NAN)),
    ("mad", lambda: st.mad(WITH_NAN)),
    ("median_rel_se", lambda: st.median_rel_se(WITH_NAN)),
    ("relative_spread", lambda: st.relative_spread(WITH_NAN)),
    ("median_ci-low", lambda: st.median_ci(WITH_NAN)[0]),
    ("median_ci-high", lambda: st.median_ci(WITH_NAN)[1]),
    ("shift_ci-a", lambda: st.shift_ci(WITH_NAN, [1.0] * 7)[1]),
    ("shift_ci-b", lambda: st.shift_ci([9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0], WITH_NAN)[2]),
    ("shift_ci-empty", lambda: st.shift_ci([], [1.0, 2.0])[0]),
]


@pytest.mark.parametrize("fn", [t[1] for t in NAN_IN_NAN_OUT], ids=[t[0] for t in NAN_IN_NAN_OUT])
def test_a_nan_sample_gives_nan_not_an_exception(fn):
    assert math.isnan(fn())  # no honest answer: the verdict turns NaN into INCONCLUSIVE


def test_the_same_calls_answer_without_the_nan():
    clean = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert st.median(clean) == 4.0 and st.mad(clean) == 2.0 and st.iqr(clean) == 3.0
    est, lo, hi = st.shift_ci([x + 10 for x in clean], clean)
    assert est == 10.0 and lo < 10.0 < hi


def test_order_statistic_ci_for_20_samples_is_ranks_6_and_15():
    xs = list(range(1, 21))
    assert st.median_ci(xs, 0.95) == (6.0, 15.0)  # coverage 1 - 2 * P(Binom(20, .5) <= 5) = 0.9586


def test_ci_is_nan_when_too_few_samples():
    lo, hi = st.median_ci([1.0, 2.0, 3.0, 4.0, 5.0], 0.95)  # best coverage with n=5 is 0.9375
    assert math.isnan(lo) and math.isnan(hi)
    assert st.median_ci([1, 2, 3, 4, 5, 6], 0.95) == (1.0, 6.0)  # n=6: 1 - 2/64 = 0.969


def _distinct_differences(n, m):
    """Samples whose n x m differences are all distinct: a = 0, 1, ..., b = 0.001 j."""
    return [float(i) for i in range(n)], [0.001 * j for j in range(m)]


# n, m, k: the interval is [D_(k), D_(nm+1-k)] with k - 1 the two-sided 5% critical value of U
# from the published Mann-Whitney tables (n = m = 5: 2; 10: 23; 20: 127; 8 vs 12: 22)
CRITICAL = [(5, 5, 3), (10, 10, 24), (20, 20, 128), (8, 12, 23)]


@pytest.mark.parametrize("n,m,k", CRITICAL, ids=[f"{n}x{m}" for n, m, _ in CRITICAL])
def test_shift_interval_uses_the_tabled_mann_whitney_critical_value(n, m, k):
    a, b = _distinct_differences(n, m)
    diffs = sorted(x - y for x in a for y in b)
    est, lo, hi = st.shift_ci(a, b, 0.95)
    assert (lo, hi) == (diffs[k - 1], diffs[n * m - k])
    assert est == pytest.approx((diffs[(n * m - 1) // 2] + diffs[n * m // 2]) / 2)


def test_shift_interval_is_the_set_of_shifts_the_test_does_not_reject():
    """Inverting scipy's two-sided Mann-Whitney test on a grid of shifts gives the same interval."""
    import numpy as np
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(7)
    a, b = list(rng.lognormal(0.3, 0.2, 9)), list(rng.lognormal(0.0, 0.2, 11))
    est, lo, hi = st.shift_ci(a, b, 0.95)
    for d in np.linspace(lo - 0.3, hi + 0.3, 241):
        if min(abs(d - lo), abs(d - hi)) < 1e-9:
            continue
        accepted = mannwhitneyu(np.array(a) - d, b, method="exact").pvalue > 0.05
        assert accepted == (lo < d < hi), (d, lo, hi)


def test_shift_interval_is_nan_when_too_few_samples_to_reach_the_confidence():
    est, lo, hi = st.shift_ci([5.0, 6.0, 7.0], [1.0, 2.0, 3.0], 0.95)  # the smallest p of 3 vs 3 is 0.1
    assert est == 4.0 and math.isnan(lo) and math.isnan(hi)
    assert math.isfinite(st.shift_ci([5.0, 6.0, 7.0], [1.0, 2.0, 3.0], 0.80)[1])


def test_shift_interval_uses_the_normal_approximation_for_many_samples():
    a, b = _distinct_differences(150, 150)  # 300 samples: past the exact distribution's limit
    diffs = sorted(x - y for x in a for y in b)
    est, lo, hi = st.shift_ci(a, b, 0.95)
    # k = nm/2 - 1.96 sd(U) (continuity-corrected), sd(U) = sqrt(nm (n + m + 1) / 12) = 751.2
    k = 150 * 150 / 2 - 1.959964 * (150 * 150 * 301 / 12) ** 0.5
    assert abs(diffs.index(lo) + 1 - k) <= 1.5 and lo < est < hi
