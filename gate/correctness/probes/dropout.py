"""Dropout checks: is the kernel's random mask a plausible, reproducible Bernoulli(1 - p) draw?

The error ratio already covers the arithmetic: run_case feeds the mask the kernel exposed
(KernelOutput.dropout_keep: tiled's own, FA2's S_dmask sign, SDPA flash's debug mask) to both
references, so a wrong rescale fails `out`, and a backward that draws a new mask instead of
reusing the forward's fails dq/dk/dv. These checks cover what the ratio cannot see:

  * dropout_rate: the kept fraction over the allowed (query, key) pairs against the keep
    probability the kernel declares it realises (1 - p, or FA2's 8-bit threshold), as a
    z-score of the binomial; |z| > Z_LIMIT fails (6 sigma: a false alarm about once in 10^9
    runs, while p off by 0.01 on 10^5 pairs is z ~ 8).
  * dropout_same_seed: the same seed twice gives the same mask (on the allowed pairs: a flash
    kernel leaves the rest of its debug mask unwritten) and the same out, and the same
    grads where the kernel has a deterministic mode (a backward that draws from an unseeded RNG
    differs here).
  * dropout_new_seed: another seed gives another mask, differing in a fraction of pairs near
    2p(1 - p) (at least half of it), not a fixed pattern.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from gate.attention.inputs import make_inputs
from gate.attention.masks import allowed_mask
from gate.core.cases import Case
from gate.core.results import CheckResult
from gate.correctness.probes.determinism import run_once
from gate.kernels.base import KernelAdapter, realised_keep_probability

Z_LIMIT = 6.0
NEW_SEED_MIN_FRACTION = 0.5  # of the expected 2p(1-p) differing fraction


def binomial_z(kept: int, total: int, p: float) -> float:
    """z-score of `kept` successes in `total` Bernoulli(1 - p) trials (pure arithmetic); p is
    the drop probability."""
    if total <= 0:
        return 0.0
    sd = math.sqrt(p * (1.0 - p) / total)
    return (kept / total - (1.0 - p)) / sd


def _masks(keep) -> list[torch.Tensor | None]:
    return list(keep) if isinstance(keep, (list, tuple)) else [keep]


def _allowed(case: Case, n_q: int, n_k: int, device) -> torch.Tensor:
    rows = torch.arange(n_q, device=device)
    allowed = allowed_mask(rows, n_q, n_k, case.causal, case.window)
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device) if allowed is None else allowed


def kept_counts(case: Case, keep) -> tuple[int, int]:
    """(kept, total) over the (query, key) pairs that may attend; masked-out pairs carry no draw
    in a flash kernel's mask (they read as kept), so they are left out."""
    kept = total = 0
    for mask in _masks(keep):
        if mask is None:
            continue
        allowed = _allowed(case, mask.shape[-2], mask.shape[-1], mask.device).expand(mask.shape)
        kept += int((mask.bool() & allowed).sum())
        total += int(allowed.sum())
    return kept, total


def _same_masks(case: Case, a, b) -> bool:
    """Identical on every allowed pair (masked-out pairs carry no draw and may hold anything)."""
    ma, mb = _masks(a), _masks(b)
    if len(ma) != len(mb):
        return False
    for x, y in zip(ma, mb):
        if x is None or y is None:
            if x is not y:
                return False
            continue
        if x.shape != y.shape:
            return False
        allowed = _allowed(case, x.shape[-2], x.shape[-1], x.device).expand(x.shape)
        if not torch.equal(x.bool() & allowed, y.bool() & allowed):
            return False
    return True


def differing_fraction(case: Case, a, b) -> float:
    differ = total = 0
    for x, y in zip(_masks(a), _masks(b)):
        if x is None or y is None:
            continue
        allowed = _allowed(case, x.shape[-2], x.shape[-1], x.device).expand(x.shape)
        differ += int(((x.bool() != y.bool()) & allowed).sum())
        total += int(allowed.sum())
    return differ / total if total else 0.0


def dropout_check(adapter: KernelAdapter, case: Case, device: str) -> tuple[CheckResult, ...]:
    p = case.dropout_p
    if not p:
        return (CheckResult("dropout", None, 0.0, 0.0, "not applicable: the case has no dropout"),)
    claims = adapter.capabilities().deterministic_mode
    inputs = make_inputs(case, case.seeds[0], device)
    first, grads1 = run_once(adapter, case, inputs, claims)
    if first.dropout_keep is None:
        return (CheckResult("dropout", False, 0.0, 0.0, "the kernel ran with dropout but exposed no mask"),)
    results = []

    kept, total = kept_counts(case, first.dropout_keep)
    levels = adapter.capabilities().dropout_keep_levels
    keep_p = realised_keep_probability(p, levels)
    z = binomial_z(kept, total, 1.0 - keep_p)
    declared = f" (the kernel's {levels}-level threshold for p={p:g})" if levels else ""
    results.append(
        CheckResult(
            "dropout_rate",
            abs(z) <= Z_LIMIT,
            z,
            Z_LIMIT,
            f"kept {kept}/{total} = {kept / max(total, 1):.4f} of allowed pairs, expected {keep_p:.4f}{declared} (|z| <= {Z_LIMIT:g})",
        )
    )

    again, grads2 = run_once(adapter, case, inputs, claims)
    same = {
        "mask": _same_masks(case, first.dropout_keep, again.dropout_keep),
        "out": torch.equal(first.out.detach(), again.out.detach()),
    }
    if claims:
        same.update({n: torch.equal(g1, g2) for n, g1, g2 in zip(("dq", "dk", "dv"), grads1, grads2)})
    differ = [n for n, ok in same.items() if not ok]
    graded = ", ".join(same) + ("" if claims else " (grads not compared: no deterministic mode)")
    results.append(
        CheckResult(
            "dropout_same_seed",
            not differ,
            float(len(differ)),
            0.0,
            f"seed {inputs.seed} twice: identical {graded}"
            if not differ
            else f"seed {inputs.seed} twice: {', '.join(differ)} differ",
        )
    )
    del again, grads2, grads1

    other, _ = run_once(adapter, case, dataclasses.replace(inputs, seed=inputs.seed + 1), claims)
    frac = differing_fraction(case, first.dropout_keep, other.dropout_keep)
    expected = 2 * p * (1 - p)
    results.append(
        CheckResult(
            "dropout_new_seed",
            frac >= NEW_SEED_MIN_FRACTION * expected,
            frac,
            NEW_SEED_MIN_FRACTION * expected,
            f"seed {inputs.seed} vs {inputs.seed + 1}: masks differ in {frac:.4f} of allowed pairs (independent draws: {expected:.4f})",
        )
    )
    return tuple(results)
