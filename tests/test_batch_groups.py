"""A dense case too large for one float64 reference is judged a group of batch elements at a time,
and its row says what one reference over the whole batch would: the same worst error in the same
place, the same bounds and ratios, the same means (to the last bits a weighted sum can move)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import gate.correctness.run_case as rc
from gate.attention.inputs import make_inputs
from gate.core.cases import Case
from gate.core.config import ToleranceConfig
from gate.kernels.registry import get_adapter

TOL = ToleranceConfig()
BASE = dict(batch=5, seqlen_q=33, seqlen_k=65, heads_q=4, heads_kv=2, head_dim=32, head_dim_v=32, dtype="bf16")


def _judged(case, raw, inputs, limit, monkeypatch):
    monkeypatch.setattr(rc, "REFERENCE_WHOLE_ELEMENTS", limit)
    monkeypatch.setattr(rc, "REFERENCE_GROUP_ELEMENTS", limit)
    adapter = get_adapter("tiled")
    return rc.judge_seed(case, inputs, raw, TOL, rc.KernelTraits.of(adapter))


def _raw(case, plant=None):
    inputs = make_inputs(case, 0, "cpu")
    raw = rc.kernel_outputs(get_adapter("tiled"), case, inputs)
    if plant is not None:  # one wrong element, in a group past the first
        out = raw.out.detach().clone()
        out[plant] += 1.0
        raw = dataclasses.replace(raw, out=out)
    return inputs, raw


@pytest.mark.parametrize(
    "fields, plant",
    [
        (dict(causal=True), None),
        (dict(causal=True), (3, 5, 1, 7)),
        # seqlen_q > seqlen_k, causal: rows with no key, an LSE of -inf compared over its finite rows
        (dict(seqlen_q=65, seqlen_k=33, causal=True), None),
        (dict(dtype="fp16", heads_kv=4), (4, 0, 0, 0)),
    ],
)
def test_groups_of_batch_elements_give_the_row_one_reference_gives(fields, plant, monkeypatch):
    case = Case.build(**{**BASE, **fields})
    inputs, raw = _raw(case, plant)
    whole = _judged(case, raw, inputs, 2**40, monkeypatch)
    grouped = _judged(case, raw, inputs, 110_000, monkeypatch)  # two batch elements a group
    assert rc.batch_groups(case) == [(0, 2), (2, 4), (4, 5)]
    assert "references computed in 3 groups of batch elements" in grouped.notes
    assert [e.tensor for e in grouped.errors] == [e.tensor for e in whole.errors] == ["out", "dq", "dk", "dv", "lse"]
    for g, w in zip(grouped.errors, whole.errors):
        exact = dataclasses.replace(g, mean_err=w.mean_err, pt_mean_err=w.pt_mean_err, mean_bound=w.mean_bound)
        assert dataclasses.replace(exact, mean_ratio=w.mean_ratio) == w, g.tensor
        assert g.mean_err == pytest.approx(w.mean_err, rel=1e-12) and g.mean_ratio == pytest.approx(w.mean_ratio)
    if plant is not None:
        out = next(e for e in grouped.errors if e.tensor == "out")
        assert out.worst_index == plant and out.ratio > 1


def test_a_nan_in_a_later_group_is_the_worst_element(monkeypatch):
    """(out and the gradients with a NaN are refused before they are measured; the LSE is not)"""
    case = Case.build(**BASE)
    inputs, raw = _raw(case)
    lse = raw.lse.detach().clone()
    lse[1, 2, 3] += 0.5  # large, in the first group
    lse[4, 0, 1] = float("nan")  # NaN, in the last: it is the worst
    raw = dataclasses.replace(raw, lse=lse)
    whole = _judged(case, raw, inputs, 2**40, monkeypatch).errors[-1]
    grouped = _judged(case, raw, inputs, 110_000, monkeypatch).errors[-1]
    assert grouped.tensor == "lse" and grouped.worst_index == whole.worst_index == (4 * 4 * 33 + 1,)
    assert grouped.max_err == grouped.mean_err == float("inf")
    assert dataclasses.replace(grouped, pt_mean_err=whole.pt_mean_err, mean_bound=whole.mean_bound) == whole


@pytest.mark.parametrize(
    "fields",
    [
        dict(batch=1),
        dict(bias="dense"),
        dict(sinks=True),
        dict(dropout_p=0.1),
        dict(dtype="e4m3"),
        dict(varlen=(33, 20, 1, 5, 9), seqlen_q=33, seqlen_k=33),
        dict(seqlen_q=1, seqlen_k=65, entry="kvcache"),
    ],
)
def test_only_a_dense_batch_with_nothing_shared_across_it_is_grouped(fields, monkeypatch):
    """A bias, sinks (dsink sums over the batch), a dropout mask, fp8 descales, a packed varlen
    batch or a decode cache: one reference, however large."""
    monkeypatch.setattr(rc, "REFERENCE_WHOLE_ELEMENTS", 1)
    monkeypatch.setattr(rc, "REFERENCE_GROUP_ELEMENTS", 1)
    assert rc.batch_groups(Case.build(**{**BASE, "heads_kv": 4, **fields})) is None
    assert rc.batch_groups(Case.build(**{**BASE, "heads_kv": 4})) == [(b, b + 1) for b in range(5)]


def test_the_default_limits_leave_every_built_in_case_whole_but_group_a_2_31_batch():
    """No case of the built-in suites is grouped (each is judged as before); batch 2,049 x 1,024
    tokens x 8 heads x d128 (2^31 elements a tensor, 128 GiB of float64 reference) is, 128 elements
    (8 GiB) a group."""
    from gate.core.cases import load_suite

    for name in ("smoke", "pr", "nightly"):
        assert not [c.id for c in load_suite(name).cases if rc.batch_groups(c)], name
    big = Case.build(**{**BASE, "batch": 2049, "seqlen_q": 1024, "seqlen_k": 1024, "heads_q": 8, "heads_kv": 8})
    big = big.with_fields(head_dim=128, head_dim_v=128)
    groups = rc.batch_groups(big)
    assert groups[0] == (0, 128) and groups[-1] == (2048, 2049) and len(groups) == 17
    assert torch.Size([2049, 1024, 8, 128]).numel() > 2**31


def test_a_spec_comparing_a_selection_locates_its_worst_element_flat():
    """The finite elements of a tensor have no shape to index: a finite_only spec is flat_index too,
    which is what places a group's worst LSE element in the whole tensor."""
    from gate.correctness.tolerance import TensorSpec

    with pytest.raises(ValueError, match="finite_only needs flat_index"):
        TensorSpec("lse", finite_only=True)
    assert TensorSpec("lse", finite_only=True, flat_index=True).flat_index


def test_a_tensor_with_nothing_to_compare_is_judged_by_its_floor_alone():
    """Every row fully masked: the LSE compares no element (its -inf is a convention). The row is all
    zeros against the rounding floor of 0 plus the LSE's extra floor, whole or in groups."""
    from gate.correctness.measure import error_part, tensor_error
    from gate.correctness.tolerance import mean_floor, rounding_floor, tensor_spec

    gold = torch.full((2, 4, 8), float("-inf"), dtype=torch.float64)
    floor = rounding_floor(0.0, "fp32") + tensor_spec("lse").floor_extra
    for parts in ([error_part("lse", gold.float(), gold, gold.float(), "bf16")], []):
        got = tensor_error("lse", parts, "bf16", 2.0, 0, 1.5)
        assert (got.max_err, got.mean_err, got.pt_err, got.pt_mean_err, got.ratio, got.mean_ratio) == (0.0,) * 6
        assert got.floor == got.bound == floor and got.worst_index == () and got.band_ok
        assert (
            got.mean_floor == got.mean_bound == mean_floor(rounding_floor(0.0, "fp32"), tensor_spec("lse").floor_extra)
        )
