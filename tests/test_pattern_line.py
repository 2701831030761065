"""The pattern line diagnoses: which tensors fail, and a derived trait of the failing cases that
no passing case has, stated with counts. Tables of synthetic cases; no kernel runs."""

from __future__ import annotations

import pytest

from gate.core.cases import Case
from gate.core.results import CaseResult, Status, TensorError
from gate.report.comment import diagnosis, failing_tensors, separating_trait

BASE = Case.build(batch=2, seqlen_q=128, seqlen_k=128, heads_q=4, heads_kv=4, head_dim=64, head_dim_v=64, dtype="bf16")


def case(**kw) -> Case:
    return BASE.with_fields(**kw)


def result(c: Case, over: dict[str, float]) -> CaseResult:
    """A measured row whose tensors have these ratios (the others at 0.5)."""
    ratios = {"out": 0.5, "lse": 0.5, "dq": 0.5, "dk": 0.5, "dv": 0.5, **over}
    tensors = tuple(TensorError(name, r, r, 1.0, 0.0, 2.0, 1.0, r, (), 1e-2, 1e-2, True, 0) for name, r in ratios.items())
    return CaseResult(case=c, status=Status.FAIL if any(r > 1 for r in over.values()) else Status.PASS, tensors=tensors)


# the H200 run: dQ off only where the head dim is not a multiple of 32, in both dtypes
ODD_DIMS = (59, 72, 80, 104, 111)
FAILING = [result(case(head_dim=d, head_dim_v=d, dtype=dt, causal=causal), {"dq": 4.0 + d / 100})
           for d in ODD_DIMS for dt in ("bf16", "fp16") for causal in (False, True)]
PASSING = [case(head_dim=d, head_dim_v=d, dtype=dt, causal=causal)
           for d in (32, 64, 96, 128, 192, 256) for dt in ("bf16", "fp16") for causal in (False, True)]


def test_dq_on_head_dims_not_a_multiple_of_32_is_named_with_counts():
    line = diagnosis(FAILING, PASSING)
    assert line.startswith("every failing tensor is dq (20 cases); ")
    assert "every failing case (20) has a head dim not a multiple of 32; none of the 24 passing cases does" in line
    assert "no single trait" not in line


@pytest.mark.parametrize("failing,passing,expected", [
    # q shorter than k: the bottom-right alignment of a causal mask
    ([case(seqlen_q=97, seqlen_k=257), case(seqlen_q=1, seqlen_k=339)], [case(), case(seqlen_q=239, seqlen_k=1)],
     "every failing case (2) has seqlen_q < seqlen_k; none of the 2 passing cases does"),
    ([case(seqlen_q=239, seqlen_k=1)], [case(), case(seqlen_q=97, seqlen_k=257)],
     "the failing case has seqlen_q > seqlen_k; none of the 2 passing cases does"),
    # GQA group size 4 only (MHA and group 2 pass)
    ([case(heads_q=8, heads_kv=2), case(heads_q=4, heads_kv=1, dtype="fp16")],
     [case(), case(heads_q=4, heads_kv=2), case(dtype="fp16")],
     "every failing case (2) has GQA group size 4; none of the 3 passing cases does"),
    # one entry point
    ([case(varlen=(48, 128)), case(varlen=(48, 128), dtype="fp16")], [case(), case(dtype="fp16")],
     "every failing case (2) has entry point varlen; none of the 2 passing cases does"),
    # one layout, one input distribution
    ([case(layout="k_sliced"), case(layout="k_sliced", causal=True)], [case(), case(causal=True)],
     "every failing case (2) has layout k_sliced; none of the 2 passing cases does"),
    ([case(inputs="large"), case(inputs="large", dtype="fp16")], [case(), case(dtype="fp16")],
     "every failing case (2) has large inputs; none of the 2 passing cases does"),
    # head dim 96 fails, 64 and 128 pass: not a multiple of 64 (96 is one of 32)
    ([case(head_dim=96, head_dim_v=96), case(head_dim=96, head_dim_v=96, dtype="fp16")],
     [case(), case(head_dim=128, head_dim_v=128), case(head_dim=32, head_dim_v=32, seqlen_q=64)],
     None),
])
def test_a_derived_trait_that_separates_is_stated_with_counts(failing, passing, expected):
    assert separating_trait(failing, passing) == expected


@pytest.mark.parametrize("over,expected", [
    ([{"dq": 3.0}, {"dq": 2.0}], "every failing tensor is dq (2 cases)"),
    ([{"lse": 1.5}], "every failing tensor is lse (1 case)"),
    ([{"dq": 3.0, "dk": 2.0}, {"dq": 2.0}, {"lse": float("nan")}], "failing tensors: dq in 2 cases, dk in 1 case, lse in 1 case"),
    ([{}], ""),
])
def test_failing_tensors_are_counted_per_case(over, expected):
    assert failing_tensors([result(case(seqlen_q=100 + i), o) for i, o in enumerate(over)]) == expected
