"""The tolerance rule, as plain arithmetic (no torch): what "within error" means.

For a tensor T of the kernel K, with G the float64 reference and P the same math in the input
dtype, all from the same rounded inputs:
    bound = mult * max|P - G| + floor        floor = 2 * rounding of the dtype near 0.3 (never 0)
    ratio = max|K - G| / bound               pass when ratio <= 1; headroom = 1 - ratio
A kernel may be as wrong as `mult` times what PyTorch's own low-precision arithmetic loses, plus
rounding. A fixed atol/rtol band fails correct kernels (every bf16 causal row, measured on an
H200); this rule does not, and still catches a 2% error in dK.
"""

from __future__ import annotations

import math

# The seed lecture's per-dtype bands (atol, rtol): reported as information, never the verdict.
BANDS = {"fp32": (1e-5, 1e-4), "bf16": (5e-3, 5e-3), "fp16": (1e-3, 1e-3)}

# Machine epsilon per dtype; the spacing of numbers near 0.3 is eps / 4 (0.3 lies in [0.25, 0.5)).
EPS = {"fp32": 2.0**-23, "bf16": 2.0**-7, "fp16": 2.0**-10}


# the LSE floor's allowance for approximate exp/log (kernels use fast transcendental
# functions: torch's CPU flash kernel's vectorised exp, ex2.approx/lg2.approx on NVIDIA GPUs). An
# error in the row sum l of relative size e moves LSE = m + log(l) by e, whatever |LSE| is, so
# this is absolute. Measured on CPU: torch's CPU kernel errs 2.4-3.0e-5 in bf16/fp16 (d 40-128;
# up to 6e-5 on causal rows), tiled and the float32 reference ~5e-7. 2**-12 = 2.4e-4 keeps those
# at ratio <= ~0.25, and an LSE off by 1e-3 fails at ratio ~4 (tests/test_coverage_axes.py).
LSE_APPROX_FLOOR = 2.0**-12


def rounding_floor(measured: float, dtype: str) -> float:
    """2 * rounding measured near 0.3, but never below one spacing there (never 0)."""
    return max(measured, EPS[dtype] / 4)


def error_bound(pt_err: float, floor: float, mult: float) -> float:
    return mult * pt_err + floor


def error_ratio(err: float, bound: float) -> float:
    """err / bound; NaN error is infinitely bad (a NaN must never compare as passing).

    Fail closed when the yardstick itself broke: a NaN or infinite bound (the low-precision
    reference overflowed) judges nothing, so the ratio is inf, never NaN (a NaN ratio would lose
    every max() over seeds) and never 0 (an inf bound would pass anything)."""
    if math.isnan(err) or math.isnan(bound) or math.isinf(bound):
        return math.inf
    if bound <= 0:
        return 0.0 if err == 0 else math.inf
    return err / bound
