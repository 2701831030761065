"""Planted upstream bugs for the known-failures tests (tests/test_known_failures.py), in the
flash_attn_func convention and built on tests/buggy_kernels.py's plain implementation:

  causal_dq_bug         dQ 10% too large on causal calls only: the "upstream bug" a project declares
  causal_dq_bug_and_dk  the same, and dK 5% too large on the same causal calls: a new bug inside the
                        declared cases, on a tensor the declaration does not name
  fixed                 the upstream fix landed: correct everywhere
"""

from __future__ import annotations

from gate.correctness.planted import ScaleGrad
from tests.buggy_kernels import _plain, _result


def causal_dq_bug(
    q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None, return_attn_probs=False
):
    if causal:
        q = ScaleGrad.apply(q, 1.1)
    return _result(*_plain(q, k, v, softmax_scale, causal, window_size, alibi_slopes), return_attn_probs)


def causal_dq_bug_and_dk(
    q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None, return_attn_probs=False
):
    if causal:
        q, k = ScaleGrad.apply(q, 1.1), ScaleGrad.apply(k, 1.05)
    return _result(*_plain(q, k, v, softmax_scale, causal, window_size, alibi_slopes), return_attn_probs)


def fixed(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None, return_attn_probs=False):
    return _result(*_plain(q, k, v, softmax_scale, causal, window_size, alibi_slopes), return_attn_probs)
