"""The two headroom predicates on plain floats, shared by the verdict rules (check) and the
baseline diff (baseline update), so both call the same change "a regression" or "a large improvement".
"""

from __future__ import annotations


def is_headroom_regression(base: float, cur: float, factor: float, step: float) -> bool:
    """Grown by more than `factor` AND by more than `step` (both, so tiny ratios cannot flake)."""
    return cur > base * factor and cur - base > step


def is_large_improvement(base: float, cur: float, factor: float, step: float) -> bool:
    return cur * factor <= base and base - cur > step
