"""User kernels that end the process instead of returning: the gate must never read that as a pass."""

import sys


def exits_zero(q, k, v, softmax_scale=None, causal=False):
    sys.exit(0)


def exits_one(q, k, v, softmax_scale=None, causal=False):
    raise SystemExit(1)
