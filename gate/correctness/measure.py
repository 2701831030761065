"""One tensor's errors against its references, as parts that combine.

A part holds what the elements of one slice say (their worst error and where it is, their mean,
the yardstick's, the rounding of the golden values, whether they sit in the band); `tensor_error`
turns the parts of one tensor into its TensorError. A tensor measured whole is one part; a dense
case whose references are computed per group of batch elements (run_case.batch_groups) is one part
per group, and combines to the figures the whole tensor would give: maxima are maxima, means are
weighted by the elements compared, the worst element's index is placed in the whole tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from gate.attention.inputs import TORCH_DTYPES
from gate.core.results import TensorError, error_ratio
from gate.correctness.tolerance import BANDS, error_bound, mean_floor, rounding_floor, tensor_spec


@dataclass(frozen=True)
class ErrorPart:
    """The compared elements of one slice of a tensor (batch elements from `batch_start` on)."""

    count: int  # elements compared (the finite golden ones, for a finite_only tensor)
    max_err: float  # inf where an element is NaN
    mean_err: float
    worst: tuple[int, ...]  # the worst (or first NaN) element: flat among the compared, or per dim
    pt_err: float  # the yardstick's max and mean error
    pt_mean_err: float
    rounding: float  # 2 x the largest rounding of a golden value in the floor's dtype
    band_ok: bool
    nan: bool = False  # an element is NaN (max_err and mean_err are then inf)
    batch_start: int = 0


def unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The index of element `flat` of a row-major tensor of `shape`: numpy's (torch imports it), not
    torch.unravel_index, whose first call imports sympy (a third of a second in every process)."""
    return tuple(int(i) for i in np.unravel_index(flat, shape))


def error_part(
    name: str, kernel: torch.Tensor, gold: torch.Tensor, low: torch.Tensor, dtype: str, batch_start: int = 0
) -> ErrorPart:
    """The part of tensor `name` these elements make: the kernel's, the golden reference's and the
    yardstick's values of the same slice, compared as tolerance.SPECS says."""
    spec = tensor_spec(name)
    floor_dtype = spec.yardstick_dtype or dtype
    k, g, p = kernel.double(), gold.double(), low.double()
    if spec.finite_only:
        keep = torch.isfinite(g)
        k, g, p = k[keep], g[keep], p[keep]
    if g.numel() == 0:
        return ErrorPart(0, 0.0, 0.0, (), 0.0, 0.0, 0.0, True, batch_start=batch_start)
    diff = (k - g).abs()
    nan = torch.isnan(diff)
    has_nan = bool(nan.any())
    if has_nan:  # a NaN is infinitely wrong, and written so: files hold no NaN a reader must refuse
        flat = int(nan.flatten().nonzero()[0])
        max_err = mean_err = math.inf
    else:
        flat = int(diff.flatten().argmax())
        max_err = float(diff.flatten()[flat])
        mean_err = float(diff.mean())
    worst = (flat,) if spec.flat_index else unravel(flat, tuple(diff.shape))
    # a yardstick that broke (NaN) judges nothing: an infinite bound, so the ratio is inf (error_ratio)
    pt_diff = torch.nan_to_num((p - g).abs(), nan=math.inf)
    gd = g.to(TORCH_DTYPES[floor_dtype])
    atol, rtol = BANDS[dtype]
    return ErrorPart(
        count=g.numel(),
        max_err=max_err,
        mean_err=mean_err,
        worst=worst,
        pt_err=float(pt_diff.max()),
        pt_mean_err=float(pt_diff.mean()),
        rounding=2.0 * float(((gd + 0.3) - 0.3 - gd).abs().max()),
        band_ok=bool((diff <= atol + rtol * g.abs()).all()),
        nan=has_nan,
        batch_start=batch_start,
    )


def _mean(parts: list[ErrorPart], field: str) -> float:
    if len(parts) <= 1:  # measured whole: the mean as computed, not re-weighted (none compared: 0)
        return getattr(parts[0], field) if parts else 0.0
    total = sum(p.count for p in parts)
    return math.fsum(getattr(p, field) * p.count for p in parts) / total


def _worst_in_whole(name: str, parts: list[ErrorPart], chosen: int) -> tuple[int, ...]:
    part = parts[chosen]
    if tensor_spec(name).flat_index:  # flat among the compared elements: those of the parts before
        return (sum(p.count for p in parts[:chosen]) + part.worst[0],)
    return (part.batch_start + part.worst[0], *part.worst[1:])  # the batch dim leads


def tensor_error(
    name: str, parts: list[ErrorPart], dtype: str, mult: float, seed: int, mean_mult: float
) -> TensorError:
    """The TensorError of tensor `name` from its parts (in batch order): the max bound (`mult`) and
    the mean bound (`mean_mult`) over all the elements they compared."""
    spec = tensor_spec(name)
    floor_dtype = spec.yardstick_dtype or dtype
    atol, rtol = BANDS[dtype]
    compared = [p for p in parts if p.count]  # none: every figure 0, the bound the floor alone
    # the first NaN, else the largest error (the first of equals), as one argmax over the whole
    nans = [i for i, p in enumerate(compared) if p.nan]
    chosen = nans[0] if nans else max(range(len(compared)), key=lambda i: (compared[i].max_err, -i), default=None)
    max_err = compared[chosen].max_err if compared else 0.0
    worst = _worst_in_whole(name, compared, chosen) if compared else ()
    mean_err = math.inf if nans else _mean(compared, "mean_err")
    pt_err = max((p.pt_err for p in compared), default=0.0)
    pt_mean_err = _mean(compared, "pt_mean_err")
    rounding = rounding_floor(max((p.rounding for p in compared), default=0.0), floor_dtype)
    floor = rounding + spec.floor_extra
    bound = error_bound(pt_err, floor, mult)
    mean_floor_ = mean_floor(rounding, spec.floor_extra)
    mean_bound = error_bound(pt_mean_err, mean_floor_, mean_mult)
    return TensorError(
        tensor=name,
        max_err=max_err,
        mean_err=mean_err,
        pt_err=pt_err,
        floor=floor,
        mult=mult,
        bound=bound,
        ratio=error_ratio(max_err, bound),
        worst_index=worst,
        band_atol=atol,
        band_rtol=rtol,
        band_ok=all(p.band_ok for p in compared),
        seed=seed,
        pt_mean_err=pt_mean_err,
        mean_mult=mean_mult,
        mean_floor=mean_floor_,
        mean_bound=mean_bound,
        mean_ratio=error_ratio(mean_err, mean_bound),
    )
