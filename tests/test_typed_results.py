"""Typed results: the check's context a frozen dataclass, a perf row's status the Status enum,
one comparison spec per tensor kind."""

from __future__ import annotations

import dataclasses

import pytest

from gate.compare.findings import CheckContext, decide


def test_the_check_context_is_typed_frozen_and_reads_as_a_mapping():
    ctx = CheckContext(kernel="k", suite="smoke", scope="s1-", measured=3, cases=4)
    assert (ctx.kernel, ctx["suite"], ctx.get("scope"), ctx.get("baseline_option")) == ("k", "smoke", "s1-", None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.kernel = "other"
    with pytest.raises(KeyError):
        ctx["nope"]
    assert set(ctx) == set(ctx.to_dict()) and ctx.to_dict()["measured"] == 3
    verdict = decide([], {}, ctx)
    assert verdict.context is ctx and verdict.to_dict()["context"]["scope"] == "s1-"
    assert "3 cases measured" in verdict.headline


def test_a_mapping_context_with_an_unknown_key_is_refused():
    assert decide([], {}, {"kernel": "k"}).context == CheckContext(kernel="k")
    with pytest.raises(TypeError):
        decide([], {}, {"kernal": "k"})
