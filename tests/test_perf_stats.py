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
    ("sign_test", lambda: st.sign_test(WITH_NAN, 0.5)),
    ("sign_test-nan-mu", lambda: st.sign_test([1.0] * 7, NAN)),
    ("mann_whitney-a", lambda: st.mann_whitney(WITH_NAN, [1.0, 2.0, 3.0])),
    ("mann_whitney-b", lambda: st.mann_whitney([9.0, 8.0, 7.0], WITH_NAN)),
]


@pytest.mark.parametrize("fn", [t[1] for t in NAN_IN_NAN_OUT], ids=[t[0] for t in NAN_IN_NAN_OUT])
def test_a_nan_sample_gives_nan_not_an_exception(fn):
    assert math.isnan(fn())  # no honest answer: the verdict turns NaN into INCONCLUSIVE


def test_the_same_calls_answer_without_the_nan():
    clean = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert st.median(clean) == 4.0 and st.mad(clean) == 2.0
    assert st.sign_test(clean, 0.5) == pytest.approx(2 ** -7)
    assert st.mann_whitney([9.0, 8.0, 7.0], clean) < 0.05


def test_order_statistic_ci_for_20_samples_is_ranks_6_and_15():
    xs = list(range(1, 21))
    assert st.median_ci(xs, 0.95) == (6.0, 15.0)  # coverage 1 - 2 * P(Binom(20, .5) <= 5) = 0.9586


def test_ci_is_nan_when_too_few_samples():
    lo, hi = st.median_ci([1.0, 2.0, 3.0, 4.0, 5.0], 0.95)  # best coverage with n=5 is 0.9375
    assert math.isnan(lo) and math.isnan(hi)
    assert st.median_ci([1, 2, 3, 4, 5, 6], 0.95) == (1.0, 6.0)  # n=6: 1 - 2/64 = 0.969


def test_sign_test_exact_values():
    assert st.sign_test([1.1] * 10, 1.0, "greater") == pytest.approx(2 ** -10)
    assert st.sign_test([1.1] * 10, 1.0, "less") == 1.0
    assert st.sign_test([0.9, 1.1], 1.0) == pytest.approx(0.75)
    assert math.isnan(st.sign_test([1.0, 1.0], 1.0))


def test_mann_whitney_exact_matches_enumeration():
    # complete separation with 5 vs 5: p = 1 / C(10, 5)
    assert st.mann_whitney([6, 7, 8, 9, 10], [1, 2, 3, 4, 5], "greater") == pytest.approx(1 / 252)
    assert st.mann_whitney([6, 7, 8, 9, 10], [1, 2, 3, 4, 5], "less") == pytest.approx(1.0)
    # interleaved samples: no evidence
    assert st.mann_whitney([1, 3, 5, 7, 9], [2, 4, 6, 8, 10], "greater") > 0.5


def _brute_force_tail(a, b):
    """P(rank sum of `a` >= observed) over every split of the pooled mid-ranks (the exact null)."""
    import itertools

    pooled = sorted(a + b)
    rank = {x: sum(i + 1 for i, y in enumerate(pooled) if y == x) / pooled.count(x) for x in pooled}
    ranks = [rank[x] for x in pooled]
    observed = sum(rank[x] for x in a)
    splits = list(itertools.combinations(range(len(pooled)), len(a)))
    return sum(1 for c in splits if sum(ranks[i] for i in c) >= observed - 1e-9) / len(splits)


def test_mann_whitney_with_ties_is_the_exact_permutation_p_value():
    a, b = [2, 2, 3, 3, 4, 4], [1, 1, 2, 2, 3, 3]
    assert st.mann_whitney(a, b, "greater") == pytest.approx(_brute_force_tail(a, b))
    assert st.mann_whitney(a, b, "less") == pytest.approx(_brute_force_tail([-x for x in a], [-x for x in b]))
    # a constant baseline (all ties) and a clearly slower run: 1 / C(14, 7), not a borderline 0.01
    assert st.mann_whitney([2.0] * 7, [1.0] * 7, "greater") == pytest.approx(1 / 3432)


def test_mann_whitney_large_samples_use_the_normal_approximation():
    a = [1.0 + 0.01 * i for i in range(40)]
    b = [1.1 + 0.01 * i for i in range(40)]
    assert 0.0 < st.mann_whitney(b, a, "greater") < 0.01 < st.mann_whitney(a, b, "greater")
    assert math.isnan(st.mann_whitney([1, 2], [3, 4, 5]))  # too few: no answer, not "significant"
