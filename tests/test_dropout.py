"""Dropout: the kernel's own mask drives the reference, so a wrong rescale and a backward that
draws a new mask fail the error ratio; the checks catch a wrong rate and a mask that ignores
the seed; the correct kernel (tiled) passes all of it, dense, GQA, causal with seqlen_q != seqlen_k
and varlen with an empty sequence."""

from __future__ import annotations

import math

import pytest
import torch

from gate.core.cases import Case
from gate.core.config import ToleranceConfig
from gate.core.results import Status
from gate.correctness.probes.dropout import Z_LIMIT, binomial_z, dropout_check, kept_counts
from gate.correctness.probes.registry import checks_for
from gate.correctness.run_case import run_case
from gate.kernels.tiled import TiledAdapter
from tests.depth_kernels import FixedMaskTiled, NewMaskBackwardTiled, WrongRateTiled, WrongRescaleTiled

TOL = ToleranceConfig()
DENSE = Case.build(
    batch=2,
    seqlen_q=64,
    seqlen_k=90,
    heads_q=4,
    heads_kv=2,
    head_dim=32,
    head_dim_v=32,
    dtype="bf16",
    causal=True,
    dropout_p=0.2,
    seeds=(0, 1),
    checks=("dropout",),
)
VARLEN = Case.build(
    batch=3,
    seqlen_q=70,
    seqlen_k=70,
    heads_q=2,
    heads_kv=2,
    head_dim=32,
    head_dim_v=32,
    dtype="bf16",
    dropout_p=0.15,
    varlen=(33, 0, 70),
    seeds=(0,),
    checks=("dropout",),
)


def _checks(result):
    return {c.name: c for c in result.checks}


@pytest.mark.parametrize(
    ("kept", "total", "p", "z"),
    [
        (800, 1000, 0.2, 0.0),
        (750, 1000, 0.2, -0.05 / math.sqrt(0.16 / 1000)),
        (900, 1000, 0.1, 0.0),
        (0, 0, 0.3, 0.0),
    ],
)
def test_binomial_z(kept, total, p, z):
    assert binomial_z(kept, total, p) == pytest.approx(z)


def test_kept_counts_only_count_pairs_that_may_attend():
    case = Case.build(
        batch=1,
        seqlen_q=5,
        seqlen_k=8,
        heads_q=2,
        heads_kv=2,
        head_dim=8,
        head_dim_v=8,
        dtype="fp32",
        causal=True,
        dropout_p=0.5,
    )
    all_kept = torch.ones(1, 2, 5, 8, dtype=torch.bool)
    # bottom-right causal: row i sees keys 0..i+3 -> 4+5+6+7+8 = 30 pairs per head
    assert kept_counts(case, all_kept) == (60, 60)
    assert kept_counts(case, [None, all_kept]) == (60, 60)


@pytest.mark.parametrize("case", [DENSE, VARLEN], ids=["dense-gqa-causal", "varlen-empty"])
def test_tiled_passes_dropout(case):
    result = run_case(TiledAdapter(), case, "cpu", TOL, checks_for(case))
    assert result.status is Status.PASS, result.reason
    checks = _checks(result)
    assert set(checks) == {"dropout_rate", "dropout_same_seed", "dropout_new_seed"}
    assert all(c.passed is True for c in checks.values()), checks
    assert abs(checks["dropout_rate"].value) <= Z_LIMIT


def test_wrong_rescale_fails_the_error_ratio():
    result = run_case(WrongRescaleTiled(), DENSE, "cpu", TOL, checks_for(DENSE))
    assert result.status is Status.FAIL
    assert result.tensor("out").ratio > 1, result.reason
    # the mask itself is fine: the ratio, fed the kernel's own mask, is what catches the rescale
    assert all(c.passed is True for c in result.checks), result.checks


def test_backward_drawing_a_new_mask_fails_grads_and_same_seed():
    result = run_case(NewMaskBackwardTiled(), DENSE, "cpu", TOL, checks_for(DENSE))
    assert result.status is Status.FAIL
    assert result.tensor("out").ratio <= 1  # the forward is right
    assert all(result.tensor(t).ratio > 1 for t in ("dq", "dk", "dv")), result.reason
    same = _checks(result)["dropout_same_seed"]
    assert same.passed is False and "dq" in same.detail, same


def test_wrong_rate_is_invisible_to_the_ratio_but_fails_the_z_test():
    plain = run_case(WrongRateTiled(), DENSE, "cpu", TOL)
    assert plain.status is Status.PASS, plain.reason
    rate = _checks(run_case(WrongRateTiled(), DENSE, "cpu", TOL, checks_for(DENSE)))["dropout_rate"]
    assert rate.passed is False and rate.value < -Z_LIMIT, rate


def test_mask_that_ignores_the_seed_fails_new_seed():
    result = run_case(FixedMaskTiled(), DENSE, "cpu", TOL, checks_for(DENSE))
    assert result.status is Status.FAIL
    new = _checks(result)["dropout_new_seed"]
    assert new.passed is False and new.value == 0.0, new


def test_dropout_check_on_a_case_without_dropout_is_information():
    case = Case.build(batch=1, seqlen_q=8, seqlen_k=8, heads_q=1, heads_kv=1, head_dim=8, head_dim_v=8, dtype="fp32")
    (only,) = dropout_check(TiledAdapter(), case, "cpu")
    assert only.passed is None and "not applicable" in only.detail
