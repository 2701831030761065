"""Typed results: the check's context a frozen dataclass, a perf row's status the Status enum,
one comparison spec per tensor kind."""

from __future__ import annotations

import dataclasses

import pytest

from gate.compare.findings import CheckContext, decide
from gate.core.identity import RunKey, Scope


def test_the_check_context_is_typed_frozen_and_reads_as_a_mapping():
    ctx = CheckContext.of(kernel="k", suite="smoke", scope=Scope("s1-"), measured=3, cases=4)
    assert (ctx.kernel, ctx["suite"], ctx.get("scope"), ctx.get("baseline_option")) == ("k", "smoke", "s1-", None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.kernel = "other"
    with pytest.raises(KeyError):
        ctx["nope"]
    assert set(ctx) == set(ctx.to_dict()) and ctx.to_dict()["measured"] == 3
    verdict = decide([], {}, ctx)
    assert verdict.context is ctx and verdict.to_dict()["context"]["scope"] == "s1-"
    assert "3 cases measured" in verdict.headline


def test_the_context_carries_the_runs_key_and_writes_it_flat():
    key = RunKey.of("k", "pr", "abc123", {"max_mult": 2.0, "mean_mult": 1.5}, "h200")
    ctx = CheckContext(key=key, baseline="b.json")
    assert (ctx.kernel, ctx.suite, ctx.gpu_class, ctx["suite_hash"]) == ("k", "pr", "h200", "abc123")
    written = ctx.to_dict()
    assert "key" not in written and written["tolerance"] == {"max_mult": 2.0, "mean_mult": 1.5}
    assert CheckContext.of(**written) == ctx  # the findings JSON's context reads back as the same value
    with pytest.raises(TypeError, match="RunKey"):
        CheckContext(key=("k", "pr"))


def test_a_context_scope_is_a_value_and_writes_as_its_regex():
    assert CheckContext().to_dict()["scope"] is None and CheckContext()["scope"] is None
    with pytest.raises(TypeError, match="scope"):
        CheckContext(scope="s1-")


def test_a_mapping_context_with_an_unknown_key_is_refused():
    assert decide([], {}, {"kernel": "k"}).context == CheckContext.of(kernel="k")
    with pytest.raises(TypeError):
        decide([], {}, {"kernal": "k"})


def test_a_perf_row_status_is_the_status_enum_and_its_file_keeps_ok():
    from gate.core.cases import Case
    from gate.core.results import Status
    from gate.speed.runs import PerfCaseResult

    case = Case.build(
        dtype="bf16", batch=1, heads_q=2, heads_kv=2, seqlen_q=16, seqlen_k=16, head_dim=32, head_dim_v=32
    )
    timed = PerfCaseResult(case=case, status=Status.PASS)
    assert timed.label == "OK" and timed.to_dict()["status"] == "OK"
    for status in (Status.SKIP, Status.ERROR):
        row = PerfCaseResult(case=case, status=status, reason="r")
        assert PerfCaseResult.from_dict(row.to_dict()).status is status
    with pytest.raises(ValueError, match="status OK without timing"):  # a timed row read back carries its samples
        PerfCaseResult.from_dict(timed.to_dict())
    for bad in ("FAIL", "PASS", "ok", 1, None):
        with pytest.raises(ValueError):
            PerfCaseResult.from_dict({**timed.to_dict(), "status": bad})


def test_every_tensor_a_result_may_hold_has_one_comparison_spec():
    from gate.core.results import ALL_TENSORS
    from gate.correctness.tolerance import SPECS, tensor_spec

    assert tuple(SPECS) == ALL_TENSORS
    assert all(tensor_spec(n).name == n for n in ALL_TENSORS)
    lse = tensor_spec("lse")
    assert (lse.finite_only, lse.flat_index, lse.yardstick_dtype, lse.packed_token_dim) == (True, True, "fp32", 1)
    assert [n for n, s in SPECS.items() if s.grad_of] == ["dq", "dk", "dv", "dbias", "dsink"]
    assert [n for n, s in SPECS.items() if s.exact] == ["k_cache", "v_cache"]


def test_the_comparison_code_asks_the_spec_not_the_name():
    """No `name == "lse"`-style branch in the code that measures tensors."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "gate"
    for rel in ("correctness/run_case.py", "correctness/probes/determinism.py", "workflow/isolation.py"):
        text = (root / rel).read_text()
        assert not re.search(r"""name\s*[!=]=\s*["'](out|lse|dq|dk|dv|dbias|dsink)["']""", text), rel
