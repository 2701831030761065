"""The pattern line diagnoses: which tensors fail, and a derived trait of the failing cases that
no passing case has, stated with counts. Tables of synthetic cases; no kernel runs."""

from __future__ import annotations

import pytest

from gate.compare.diagnosis import diagnosis, failing_tensors, separating_trait
from gate.core.cases import Case
from gate.core.results import CaseResult, Status
from tests.rows import tensor_errors

BASE = Case.build(batch=2, seqlen_q=128, seqlen_k=128, heads_q=4, heads_kv=4, head_dim=64, head_dim_v=64, dtype="bf16")


def case(**kw) -> Case:
    return BASE.with_fields(**kw)


def result(c: Case, over: dict[str, float]) -> CaseResult:
    """A measured row whose tensors have these ratios (the others at 0.5)."""
    tensors = tensor_errors(over)
    return CaseResult(case=c, status=Status.FAIL if any(r > 1 for r in over.values()) else Status.PASS, tensors=tensors)


# the H200 run: dQ off only where the head dim is not a multiple of 32, in both dtypes
ODD_DIMS = (59, 72, 80, 104, 111)
FAILING = [
    result(case(head_dim=d, head_dim_v=d, dtype=dt, causal=causal), {"dq": 4.0 + d / 100})
    for d in ODD_DIMS
    for dt in ("bf16", "fp16")
    for causal in (False, True)
]
PASSING = [
    case(head_dim=d, head_dim_v=d, dtype=dt, causal=causal)
    for d in (32, 64, 96, 128, 192, 256)
    for dt in ("bf16", "fp16")
    for causal in (False, True)
]


def test_dq_on_head_dims_not_a_multiple_of_32_is_named_with_counts():
    line = diagnosis(FAILING, PASSING)
    assert line.startswith("every failing tensor is dq (20 cases); ")
    assert "every failing case (20) has a head dim not a multiple of 32; none of the 24 passing cases does" in line
    assert "no single trait" not in line


@pytest.mark.parametrize(
    "failing,passing,expected",
    [
        # q shorter than k: the bottom-right alignment of a causal mask
        (
            [case(seqlen_q=97, seqlen_k=257), case(seqlen_q=1, seqlen_k=339)],
            [case(), case(seqlen_q=239, seqlen_k=1)],
            "every failing case (2) has seqlen_q < seqlen_k; none of the 2 passing cases does",
        ),
        (
            [case(seqlen_q=239, seqlen_k=1)],
            [case(), case(seqlen_q=97, seqlen_k=257)],
            "the failing case has seqlen_q > seqlen_k; none of the 2 passing cases does",
        ),
        # GQA group size 4 only (MHA and group 2 pass)
        (
            [case(heads_q=8, heads_kv=2), case(heads_q=4, heads_kv=1, dtype="fp16")],
            [case(), case(heads_q=4, heads_kv=2), case(dtype="fp16")],
            "every failing case (2) has GQA group size 4; none of the 3 passing cases does",
        ),
        # one entry point
        (
            [case(varlen=(48, 128)), case(varlen=(48, 128), dtype="fp16")],
            [case(), case(dtype="fp16")],
            "every failing case (2) has entry point varlen; none of the 2 passing cases does",
        ),
        # one layout, one input distribution
        (
            [case(layout="k_sliced"), case(layout="k_sliced", causal=True)],
            [case(), case(causal=True)],
            "every failing case (2) has layout k_sliced; none of the 2 passing cases does",
        ),
        (
            [case(inputs="large"), case(inputs="large", dtype="fp16")],
            [case(), case(dtype="fp16")],
            "every failing case (2) has large inputs; none of the 2 passing cases does",
        ),
        # head dim 96 fails, 64 and 128 pass: not a multiple of 64 (96 is one of 32)
        (
            [case(head_dim=96, head_dim_v=96), case(head_dim=96, head_dim_v=96, dtype="fp16")],
            [case(), case(head_dim=128, head_dim_v=128), case(head_dim=32, head_dim_v=32, seqlen_q=64)],
            None,
        ),
    ],
)
def test_a_derived_trait_that_separates_is_stated_with_counts(failing, passing, expected):
    assert separating_trait(failing, passing) == expected


@pytest.mark.parametrize(
    "over,expected",
    [
        ([{"dq": 3.0}, {"dq": 2.0}], "every failing tensor is dq (2 cases)"),
        ([{"lse": 1.5}], "every failing tensor is lse (1 case)"),
        (
            [{"dq": 3.0, "dk": 2.0}, {"dq": 2.0}, {"lse": float("nan")}],
            "failing tensors: dq in 2 of 3, dk in 1 of 3, lse in 1 of 3 failing cases",
        ),
        (
            [{"lse": 2.0, "dk": 2.0, "dv": 2.0, "dq": 2.0, "out": 2.0}, {"lse": 2.0, "dk": 2.0}],
            "failing tensors: dk in all 2, lse in all 2, dq in 1 of 2, dv in 1 of 2 failing cases; also out in 1",
        ),
        ([{}], ""),
    ],
)
def test_failing_tensors_are_counted_per_case(over, expected):
    assert failing_tensors([result(case(seqlen_q=100 + i), o) for i, o in enumerate(over)]) == expected


def test_counts_are_of_all_failing_cases_not_only_those_over_the_bound():
    """A dK x1.02 bug: 42 cases over the bound, 23 more failing the headroom rule within it. The
    line must not say "every failing tensor is dk (42 cases)" of 65 failing cases."""
    over = [result(case(seqlen_q=100 + i), {"dk": 1.5}) for i in range(42)]
    within = [result(case(seqlen_q=200 + i), {"dk": 0.9}) for i in range(23)]
    line = failing_tensors(over + within)
    assert "(42 cases)" not in line and "every failing" not in line
    assert line == "failing tensors: dk in 42 of 65 failing cases"
    # the check knows what the headroom findings name: then all 65 are dk
    names = {r.case_id: {"dk"} for r in within}
    assert failing_tensors(over + within, names) == "every failing tensor is dk (65 cases)"


def test_a_kernel_that_raises_past_head_dim_128_is_named_by_its_head_dim():
    """ERROR rows on head dims 192 and 256 (all MHA, like most of the suite): the line names the
    head dim threshold, not "one KV head per query head"."""
    failing = [
        CaseResult(case=case(head_dim=d, head_dim_v=d, dtype=dt), status=Status.ERROR, reason="head_dim > 128")
        for d in (192, 256)
        for dt in ("bf16", "fp16")
    ]
    passing = [case(head_dim=d, head_dim_v=d, dtype=dt) for d in (32, 64, 128) for dt in ("bf16", "fp16")]
    passing += [case(heads_q=8, heads_kv=2)]
    line = diagnosis(failing, passing)
    assert "one KV head per query head" not in line
    assert "every failing case (4) has head dim > 128; none of the 7 passing cases does" in line
    assert line.startswith("no failing case gave an answer (4 ERROR rows)")


def test_a_trait_most_passing_cases_share_is_not_named():
    failing = [
        result(case(seqlen_q=s, seqlen_k=s, dtype=dt), {"dq": 2.0})
        for s, dt in ((64, "bf16"), (192, "fp16"), (320, "bf16"))
    ]
    passing = [case(seqlen_q=s, seqlen_k=s) for s in (32, 128, 256, 384, 512, 640)] + [case(heads_q=8, heads_kv=2)]
    line = diagnosis(failing, passing)
    assert "one KV head per query head" not in line and "no single trait" in line


def test_two_traits_only_the_failing_cases_have_together_are_named():
    """A causal mask right only at equal lengths: every failing case is causal with q != k, while
    causal cases of equal lengths and non-causal ones of unequal lengths pass."""
    lengths = ((64, 80), (97, 257), (65, 33), (1, 339))
    failing = [result(case(seqlen_q=q, seqlen_k=k, causal=True), {"out": 3.0}) for q, k in lengths]
    passing = [case(seqlen_q=q, seqlen_k=k) for q, k in lengths] + [
        case(causal=True),
        case(seqlen_q=64, seqlen_k=64, causal=True),
    ]
    line = diagnosis(failing, passing)
    assert line.endswith(
        "every failing case (4) is causal and seqlen_q != seqlen_k; none of the 6 passing cases is both"
    ), line
    # one passing case that has both: no such claim
    line = diagnosis(failing, [*passing, case(seqlen_q=32, seqlen_k=48, causal=True)])
    assert "is both" not in line and "are causal" in line, line


def test_error_rows_count_as_no_answer_beside_tensors():
    """A refusal passes what each case failed on, "error" for an ERROR row: counted as no answer."""
    bad = [result(case(seqlen_q=100 + i), {"out": 2.0}) for i in range(2)]
    errors = [CaseResult(case=case(seqlen_q=200 + i), status=Status.ERROR, reason="RuntimeError") for i in range(3)]
    names = {r.case_id: {"error"} for r in errors} | {r.case_id: {"out"} for r in bad}
    assert failing_tensors(bad + errors, names) == "failing tensors: no answer in 3 of 5, out in 2 of 5 failing cases"
