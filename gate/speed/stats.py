"""Pure statistics for timing samples: plain floats in, plain floats out; no torch, no I/O.

Everything here is robust (medians, MAD, order statistics, rank tests) because GPU timings have
heavy right tails (a context switch, a clock dip) that wreck means and t-tests. Every function
that cannot answer (too few samples, a NaN sample) returns NaN rather than guessing: callers
treat NaN as INCONCLUSIVE (fail closed), never as "no difference".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# 1.4826 x MAD estimates the standard deviation of a normal sample; sqrt(pi/2) = 1.2533 is the
# asymptotic efficiency factor of the median (its standard error is 1.2533 sigma / sqrt(n)).
MAD_TO_SIGMA = 1.4826
MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)
NAN = float("nan")


def _sorted(xs: Sequence[float]) -> list[float] | None:
    """The samples sorted, or None when one is NaN: NaN has no order, so no order statistic or
    rank test can answer (callers return NaN, which the verdict turns into INCONCLUSIVE)."""
    values = [float(x) for x in xs]
    if any(math.isnan(x) for x in values):
        return None
    return sorted(values)


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default); NaN for no samples or a NaN sample."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    s = _sorted(xs)
    if not s:
        return NAN
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median(xs: Sequence[float]) -> float:
    return quantile(xs, 0.5)


def iqr(xs: Sequence[float]) -> float:
    return quantile(xs, 0.75) - quantile(xs, 0.25)


def mad(xs: Sequence[float]) -> float:
    """Median absolute deviation from the median (raw, not scaled)."""
    m = median(xs)
    if math.isnan(m):
        return NAN
    return median([abs(x - m) for x in xs])


def robust_sigma(xs: Sequence[float]) -> float:
    return MAD_TO_SIGMA * mad(xs)


def median_rel_se(xs: Sequence[float]) -> float:
    """Relative standard error of the sample median: 1.2533 x 1.4826 MAD / sqrt(n) / median.

    This is the noise of the number we compare (the median ratio), not the spread of single
    rounds: 15 rounds with a 2% spread give a median known to about 0.65%.
    """
    n = len(xs)
    m = median(xs)
    if n < 2 or math.isnan(m) or m == 0:
        return NAN
    return MEDIAN_SE_FACTOR * robust_sigma(xs) / math.sqrt(n) / abs(m)


def relative_spread(xs: Sequence[float]) -> float:
    """IQR / median: torch.utils.benchmark warns about a measurement above 10%."""
    m = median(xs)
    if math.isnan(m) or m == 0:
        return NAN
    return iqr(xs) / abs(m)


def _binom_cdf(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exact."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n


def median_ci(xs: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median from order statistics.

    The interval [x_(j), x_(n+1-j)] covers the true median with probability
    1 - 2 P(Binom(n, 1/2) <= j - 1); j is the largest rank keeping that >= `confidence`.
    (NaN, NaN) when n is too small to reach the confidence at all (n < 6 for 95%).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence} is outside (0, 1)")
    s = _sorted(xs)
    if s is None:
        return NAN, NAN
    n = len(s)
    best = 0
    for j in range(1, n // 2 + 1):
        if 1.0 - 2.0 * _binom_cdf(j - 1, n) >= confidence:
            best = j
        else:
            break
    if best == 0:
        return NAN, NAN
    return s[best - 1], s[n - best]


def sign_test(xs: Sequence[float], mu: float, alternative: str = "greater") -> float:
    """One-sided exact sign test of H0 median(xs) = mu: the p-value (NaN when no sample differs).

    Used when the baseline kept only its median: are the current per-round ratios above
    (`greater`) or below (`less`) it more often than chance allows?
    """
    if alternative not in ("greater", "less"):
        raise ValueError(f"alternative {alternative!r} is not 'greater' or 'less'")
    s = _sorted(xs)
    if s is None or math.isnan(mu):
        return NAN
    above = sum(1 for x in s if x > mu)
    below = sum(1 for x in s if x < mu)
    n = above + below
    if n == 0:
        return NAN
    k = above if alternative == "greater" else below
    return 1.0 - _binom_cdf(k - 1, n)


def _rank_sum_tail(ranks2: list[int], n1: int, observed2: int) -> float:
    """P(rank sum of a random n1-subset >= observed) over all subsets of the pooled (doubled,
    integer) mid-ranks: the exact permutation null, ties included (a subset-sum count, numpy)."""
    import numpy as np

    total = sum(ranks2)
    counts = np.zeros((n1 + 1, total + 1))  # counts[k, s]: k-subsets with doubled rank sum s
    counts[0, 0] = 1.0
    for r in ranks2:
        counts[1:, r:] += counts[:-1, :total + 1 - r].copy()
    dist = counts[n1]
    return float(dist[observed2:].sum() / dist.sum())


def mann_whitney(a: Sequence[float], b: Sequence[float], alternative: str = "greater") -> float:
    """One-sided Mann-Whitney U test: p-value for `a` stochastically greater (or less) than `b`.

    Exact permutation null (ties included) when n1 + n2 <= 60; otherwise the normal
    approximation with tie and continuity corrections. NaN when either side has < 3 samples
    (no honest answer): callers report INCONCLUSIVE.
    """
    if alternative not in ("greater", "less"):
        raise ValueError(f"alternative {alternative!r} is not 'greater' or 'less'")
    sa, sb = _sorted(a), _sorted(b)
    if sa is None or sb is None:
        return NAN
    n1, n2 = len(sa), len(sb)
    if n1 < 3 or n2 < 3:
        return NAN
    pooled = sorted([(x, 0) for x in sa] + [(x, 1) for x in sb])
    ranks = [0.0] * len(pooled)
    ties = []
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2.0 + 1.0
        if j > i:
            ties.append(j - i + 1)
        i = j + 1
    r1 = sum(r for r, (_, g) in zip(ranks, pooled) if g == 0)
    u = r1 - n1 * (n1 + 1) / 2.0  # number of (a, b) pairs with a > b (ties count half)
    if alternative == "less":
        u = n1 * n2 - u
    if n1 + n2 <= 60:  # exact permutation distribution of the rank sum (ties included)
        ranks2 = [int(round(2 * r)) for r in ranks]
        r1_2 = sum(r for r, (_, g) in zip(ranks2, pooled) if g == 0)
        if alternative == "less":  # small rank sums of `a` are large rank sums of the reversed order
            top = len(pooled) + 1
            ranks2 = [2 * top - r for r in ranks2]
            r1_2 = 2 * top * n1 - r1_2
        return _rank_sum_tail(ranks2, n1, r1_2)
    n = n1 + n2
    mean = n1 * n2 / 2.0
    tie_term = sum(t ** 3 - t for t in ties) / (n * (n - 1))
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term)
    if var <= 0:
        return NAN
    z = (u - mean - 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2.0))
