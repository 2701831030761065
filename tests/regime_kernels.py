"""A kernel that loses precision on one input regime only, for the first-baseline tests
(tests/test_first_baseline.py), in the flash_attn_func convention of tests/buggy_kernels.py:

  shifted_dq_bug   dQ 3x too large when q and k share one large aligned channel (`inputs =
                   "shifted"`: every score far below -88), as a kernel whose backward loses the
                   row's LSE there would; right on every other input
  shifted_nan_dv   the same, and dV NaN on the shifted causal calls: a FAIL whose reason is a NaN
  fixed            the fix landed: correct everywhere
"""

from __future__ import annotations

from gate.correctness.planted import ScaleGrad
from tests.buggy_kernels import _plain, _result

# gate/attention/inputs.py puts +a (~26 for head dim 32) on channel 0 of every shifted q row; a
# standard normal channel's mean over a case is near 0
SHIFTED_MEAN = 5.0
DQ_FACTOR = 3.0  # dQ 2x: far past its bound (a 10% error hides under the loose shifted bound)


def _shifted(q) -> bool:
    return bool(q[..., 0].float().mean().abs() > SHIFTED_MEAN)


def shifted_dq_bug(
    q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None, return_attn_probs=False
):
    if _shifted(q):
        q = ScaleGrad.apply(q, DQ_FACTOR)
    return _result(*_plain(q, k, v, softmax_scale, causal, window_size, alibi_slopes), return_attn_probs)


def shifted_nan_dv(
    q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None, return_attn_probs=False
):
    if _shifted(q):
        q = ScaleGrad.apply(q, DQ_FACTOR)
        if causal:
            v = ScaleGrad.apply(v, float("nan"))
    return _result(*_plain(q, k, v, softmax_scale, causal, window_size, alibi_slopes), return_attn_probs)


def fixed(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None, return_attn_probs=False):
    return _result(*_plain(q, k, v, softmax_scale, causal, window_size, alibi_slopes), return_attn_probs)
