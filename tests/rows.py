"""Measured rows for the renderers' tests: tensor errors with chosen ratios (bound 1)."""

from __future__ import annotations

from gate.core.results import TensorError

RATIOS = {"out": 0.5, "lse": 0.5, "dq": 0.5, "dk": 0.5, "dv": 0.5}


def tensor_errors(over: dict[str, float] | None = None) -> tuple[TensorError, ...]:
    """One TensorError per tensor of RATIOS, with `over`'s ratios in place of the defaults."""
    return tuple(
        TensorError(
            tensor=name,
            max_err=r,
            mean_err=r,
            pt_err=1.0,
            floor=0.0,
            mult=2.0,
            bound=1.0,
            ratio=r,
            worst_index=(),
            band_atol=1e-2,
            band_rtol=1e-2,
            band_ok=True,
            seed=0,
        )
        for name, r in {**RATIOS, **(over or {})}.items()
    )
