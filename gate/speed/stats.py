"""Pure statistics for timing samples: plain floats in, plain floats out; no torch, no I/O.

Robust on purpose (medians, MAD, order statistics, rank-based intervals): timings have heavy
right tails (a context switch, a clock dip) that wreck means and t-tests. The numbers come from
numpy and scipy.stats; what is here is only the glue they lack: NaN-in-NaN-out (no order exists
with a NaN sample), the relative standard error of a median, and the Hodges-Lehmann shift with its
Mann-Whitney interval, which scipy offers as a test (`mannwhitneyu`) but not as an interval.
Every function that cannot answer (too few samples, a NaN sample) returns NaN rather than guessing:
callers treat NaN as INCONCLUSIVE (fail closed), never as "no difference".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# 1.4826 x MAD estimates the standard deviation of a normal sample; sqrt(pi/2) = 1.2533 is the
# asymptotic efficiency factor of the median (its standard error is 1.2533 sigma / sqrt(n)).
MAD_TO_SIGMA = 1.4826
MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)
NAN = float("nan")
# scipy's exact Mann-Whitney null distribution up to this many samples in all (0.1 s at 100 + 100);
# beyond it the normal approximation, which is then accurate to far below a percent of coverage.
EXACT_MAX_SAMPLES = 200


def _array(xs: Sequence[float]) -> Any:
    """The samples as a numpy array, or None when one is NaN: NaN has no order, so no order statistic or
    rank interval can answer (callers return NaN, which the verdict turns into INCONCLUSIVE)."""
    import numpy as np

    a = np.asarray([float(x) for x in xs], dtype=float)
    return None if np.isnan(a).any() else a


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default); NaN for no samples or a NaN sample."""
    import numpy as np

    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    a = _array(xs)
    return NAN if a is None or a.size == 0 else float(np.quantile(a, q))


def median(xs: Sequence[float]) -> float:
    return quantile(xs, 0.5)


def iqr(xs: Sequence[float]) -> float:
    from scipy import stats as sps

    a = _array(xs)
    return NAN if a is None or a.size == 0 else float(sps.iqr(a))


def mad(xs: Sequence[float]) -> float:
    """Median absolute deviation from the median (raw, not scaled)."""
    from scipy import stats as sps

    a = _array(xs)
    return NAN if a is None or a.size == 0 else float(sps.median_abs_deviation(a, scale=1.0))


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


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence} is outside (0, 1)")


def median_ci(xs: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median from order statistics.

    The interval [x_(j), x_(n+1-j)] covers the true median with probability
    1 - 2 P(Binom(n, 1/2) <= j - 1); j is the largest rank keeping that >= `confidence`.
    (NaN, NaN) when n is too small to reach the confidence at all (n < 6 for 95%).
    """
    import numpy as np
    from scipy import stats as sps

    _check_confidence(confidence)
    a = _array(xs)
    if a is None or a.size == 0:
        return NAN, NAN
    s, n = np.sort(a), a.size
    # the largest j with P(Binom(n, 1/2) <= j - 1) <= (1 - confidence) / 2
    j = int(sps.binom.ppf((1.0 - confidence) / 2.0, n, 0.5))
    while j >= 1 and sps.binom.cdf(j - 1, n, 0.5) > (1.0 - confidence) / 2.0:
        j -= 1
    while sps.binom.cdf(j, n, 0.5) <= (1.0 - confidence) / 2.0:
        j += 1
    if j < 1:
        return NAN, NAN
    return float(s[j - 1]), float(s[n - j])


def _u_cdf(u: int, n: int, m: int) -> float:
    """P(U <= u) under the null for the Mann-Whitney U (pairs x > y) of samples of n and m without
    ties: scipy's `mannwhitneyu` p-value ('less') on two samples built to have exactly that U."""
    import numpy as np
    from scipy import stats as sps

    y = np.arange(m, dtype=float)
    below = np.minimum(m, np.maximum(0, u - m * np.arange(n)))  # u pairs spread over the x's, m at most each
    # an x in (k - 1, k) is above exactly k of the y's; distinct x's, so no ties for the
    # asymptotic method's tie correction to act on
    x = below - 0.5 + np.arange(n) / (4.0 * n)
    method = "exact" if n + m <= EXACT_MAX_SAMPLES else "asymptotic"
    return float(sps.mannwhitneyu(x, y, alternative="less", method=method).pvalue)


def shift_ci(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """The Hodges-Lehmann shift of `a` over `b` with its Mann-Whitney confidence interval.

    For two independent samples that differ by a shift d, the estimate is the median of all n x m
    differences a_i - b_j, and [D_(k), D_(nm+1-k)] of the sorted differences is the set of shifts
    the two-sided Mann-Whitney test does not reject: it covers d with probability >= `confidence`
    whatever the (continuous) distribution (Hollander & Wolfe, ch. 4). Returns (estimate, low,
    high); (NaN, NaN, NaN) with a NaN sample or too few samples to reach `confidence` (3 + 3 at 95%
    cannot: the smallest two-sided p-value of 3 vs 3 is 0.1).
    """
    import numpy as np

    _check_confidence(confidence)
    x, y = _array(a), _array(b)
    if x is None or y is None or x.size == 0 or y.size == 0:
        return NAN, NAN, NAN
    n, m = x.size, y.size
    diffs = np.sort((x[:, None] - y[None, :]).ravel())
    tail = (1.0 - confidence) / 2.0
    lo, hi = 0, (n * m) // 2 + 1  # find the largest k with P(U <= k - 1) <= tail: coverage 1 - 2 P(U <= k - 1)
    if _u_cdf(0, n, m) > tail:
        return float(np.median(diffs)), NAN, NAN
    while hi - lo > 1:  # invariant: P(U <= lo - 1) <= tail < P(U <= hi - 1); P(U <= -1) = 0
        mid = (lo + hi) // 2
        if _u_cdf(mid - 1, n, m) <= tail:
            lo = mid
        else:
            hi = mid
    k = lo
    return float(np.median(diffs)), float(diffs[k - 1]), float(diffs[n * m - k])
