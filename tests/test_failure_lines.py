"""The failing cases as a person reads them (gate/report/failures.py): one line per case in
pytest's short-summary style, worst first, and the rows grouped by the case axis that separates
them, with counts of cases. Tables of synthetic rows; no kernel runs."""

from __future__ import annotations

import math

from gate.compare.known import failures_of
from gate.core.cases import Case
from gate.core.results import CaseResult, Status
from gate.report.failures import group_failures, refusal, row_line, worst_first
from tests.rows import RATIOS, tensor_errors

BASE = Case.build(batch=2, seqlen_q=128, seqlen_k=128, heads_q=4, heads_kv=4, head_dim=64, head_dim_v=64, dtype="bf16")


def row(over: dict[str, float] | None = None, status: Status | None = None, reason: str = "", **kw) -> CaseResult:
    ratios = {**RATIOS, **(over or {})}
    tensors = tensor_errors(over)
    failed = any(not r <= 1 for r in ratios.values())
    return CaseResult(
        case=BASE.with_fields(**kw),
        status=status or (Status.FAIL if failed else Status.PASS),
        reason=reason,
        tensors=tensors if status is not Status.ERROR else (),
    )


def test_the_short_summary_line_names_the_worst_ratio_and_the_nan_beside_it():
    line = row_line(row({"dk": 14121.0, "dv": math.nan}))
    assert line.text == f"FAIL {BASE.id}  dk 14,121x its bound (NaN in dv)" and line.size == math.inf
    assert row_line(row({"dq": 6.2, "dk": 1.5})).text == f"FAIL {BASE.id}  dq 6.2x its bound (dk 1.5x)"
    unmeasured = CaseResult(case=BASE, status=Status.FAIL, reason="seed 0: dv contains NaN/Inf")
    assert row_line(unmeasured).text == f"FAIL {BASE.id}  NaN in dv"
    error = row(status=Status.ERROR, reason="RuntimeError: head_dim 192 > 128 is not supported")
    assert (
        row_line(error).text
        == f"ERROR {BASE.id}  no answer from the kernel (RuntimeError: head_dim 192 > 128 is not supported)"
    )
    ordered = worst_first(
        [row_line(row({"dq": 2.0}, seqlen_q=64)), row_line(row({"dq": 8.0}, seqlen_q=96)), row_line(unmeasured)]
    )
    assert [x.what for x in ordered] == ["NaN in dv", "dq 8x its bound", "dq 2x its bound"]


def test_13_failing_on_three_input_regimes_are_grouped_with_counts_of_cases():
    """As the issue's Triton kernel: 13 cases FAIL on large/shifted/outliers inputs, none on normal ones."""
    rows = [row(seqlen_q=32 + 8 * s, seqlen_k=32 + 8 * s) for s in range(10)]  # normal inputs: all pass
    fails = {"large": 4, "shifted": 6, "outliers": 3}
    passes = {"large": 2, "shifted": 0, "outliers": 5}
    for inputs, n in fails.items():
        rows += [row({"dq": 6.0 + s / 10}, seqlen_q=32 + 8 * s, seqlen_k=32 + 8 * s, inputs=inputs) for s in range(n)]
        rows += [row(seqlen_q=200 + 8 * s, seqlen_k=200 + 8 * s, inputs=inputs) for s in range(passes[inputs])]
    assert len(rows) == 30 and sum(r.status is Status.FAIL for r in rows) == 13
    failing = {r.case_id: failures_of(r) for r in rows if r.status is Status.FAIL}
    groups = group_failures(rows, failing)
    assert [(g.axis, g.value, len(g.cases), g.of_value) for g in groups] == [
        ("inputs", "shifted inputs", 6, 6),
        ("inputs", "large inputs", 4, 6),
        ("inputs", "outliers inputs", 3, 8),
    ]
    assert sum(len(g.cases) for g in groups) == 13
    assert groups[0].text.startswith("6 cases with shifted inputs fail on dq: every case with shifted inputs fails (6)")
    assert "4 of the 6 cases with large inputs" in groups[1].text
    r = refusal(rows, [(cid, sorted(n)) for cid, n in failing.items()], "mine")
    assert r.lines[0].what == "dq 6.5x its bound" and len(r.lines) == 13
    assert "failing tensors" not in r.pattern and r.pattern.startswith("every failing tensor is dq (13 cases)")
    assert r.block.count("[[tool.attn-gate.known_failures]]") == 1 and 'tensors = ["dq"]' in r.block
    assert "link" not in r.block  # the user's own kernel: no upstream to link to


def test_a_declarations_reason_names_what_only_the_failing_cases_have_and_a_nan_as_such():
    """A causal kernel that returns NaN on rows that see no key: the block's reason says so, not
    "past the bound on causal" (passing causal cases and a non-causal Nq > Nk case exist)."""
    passing = [row(causal=True), row(seqlen_q=200, seqlen_k=100), row(seqlen_q=64, seqlen_k=256, causal=True)]
    for bad, said in ((math.nan, "NaN in out"), (3.0, "out past the bound")):
        failing = [
            row({"out": bad}, seqlen_q=200, seqlen_k=100, causal=True),
            row({"out": bad}, seqlen_q=96, seqlen_k=32, causal=True),
        ]
        r = refusal(passing + failing, [(f.case_id, ["out"]) for f in failing], "mine")
        assert f'reason = "{said} on fully masked rows"' in r.block, r.block
    # "NaN in" names only what was a NaN in every case: out, not the failed determinism check
    from dataclasses import replace

    from gate.core.results import CheckResult

    nan_out = row({"out": math.nan}, seqlen_q=200, seqlen_k=100, causal=True)
    mixed = replace(nan_out, checks=(CheckResult("determinism", False, 1.0, 0.0),))
    r = refusal(passing + [mixed], [(mixed.case_id, ["determinism", "out"])], "mine")
    assert 'reason = "NaN in out and determinism past the bound on fully masked rows"' in r.block, r.block
    # unmeasured: run_case refused the output for its NaN
    unmeasured = CaseResult(case=nan_out.case, status=Status.FAIL, reason="seed 0: out contains NaN/Inf")
    r = refusal([*passing, unmeasured], [(unmeasured.case_id, ["out"])], "mine")
    assert 'reason = "NaN in out on fully masked rows"' in r.block, r.block
    # two traits together: a causal mask that raises at unequal lengths
    failing = [
        row(status=Status.ERROR, reason="RuntimeError: size mismatch", seqlen_q=q, seqlen_k=k, causal=True)
        for q, k in ((64, 80), (97, 257))
    ]
    fine = [row(causal=True), row(seqlen_q=64, seqlen_k=80), row(seqlen_q=97, seqlen_k=257)]
    r = refusal(fine + failing, [(f.case_id, ["error"]) for f in failing], "mine")
    assert 'reason = "no answer from the kernel on causal and seqlen_q != seqlen_k"' in r.block, r.block
    assert r.groups[0].text.startswith("2 cases with causal give no answer: "), r.groups[0].text
    assert r.pattern.endswith("is causal and seqlen_q != seqlen_k; none of the 3 passing cases is both"), r.pattern
    # one trait alone separates: it, not a pair with it ("causal", not "causal and GQA/MQA")
    gqa = dict(heads_q=4, heads_kv=2)
    failing = [row({"out": 3.0}, causal=True, **gqa), row({"out": 3.0}, seqlen_q=96, seqlen_k=96, causal=True, **gqa)]
    r = refusal([row(**gqa), row(), *failing], [(f.case_id, ["out"]) for f in failing], "mine")
    assert 'reason = "out past the bound on causal"' in r.block, r.block
    # nothing only the failing cases have: the values of their group, as before
    failing = [row({"out": 3.0}, seqlen_q=64, seqlen_k=64, causal=True, head_dim=32, head_dim_v=32)]
    r = refusal(
        [*passing, row(causal=True, head_dim=32, head_dim_v=32), *failing], [(failing[0].case_id, ["out"])], "mine"
    )
    assert 'reason = "out past the bound on ' in r.block and "fully masked" not in r.block, r.block


def test_the_way_forward_names_the_envelope_key_that_skips_exactly_the_failing_cases():
    """A causal mask aligned top-left: wrong wherever a causal case's lengths differ, right on
    causal cases of equal lengths and on plain ones of unequal lengths."""
    passing = [row(causal=True), row(seqlen_q=64, seqlen_k=80), row(seqlen_q=97, seqlen_k=257, heads_kv=2)]
    failing = [row({"out": 9.0}, seqlen_q=q, seqlen_k=k, causal=True) for q, k in ((64, 80), (200, 100))]
    r = refusal(passing + failing, [(f.case_id, ["out"]) for f in failing], "pkg.mod:attn")
    assert r.narrowing == "causal_seqlen_q_ne_k = false"
    text = r.text("baselines/cpu/x.json", "pkg.mod:attn", "attn-gate baseline update", "pyproject.toml", None, True)
    assert (
        "  2. narrow the envelope: if the kernel does not support these cases, declare `causal_seqlen_q_ne_k = false` "
        '(every failing case needs it, no passing case does) in [tool.attn-gate.kernels."pkg.mod:attn".supports] '
        "so they SKIP with that reason;"
    ) in text.splitlines(), text
    # an --only run of the failing cases alone: the narrowest key that fits, kept passing rows kept
    only = refusal(failing, [(f.case_id, ["out"]) for f in failing], "mine")
    assert only.narrowing == "causal_seqlen_q_ne_k = false"
    kept = [row(causal=True, seqlen_q=64, seqlen_k=80, window=(8, 0)).case]
    assert refusal(failing, [(f.case_id, ["out"]) for f in failing], "mine", kept_passing=kept).narrowing == ""
    # a backward written for causal attention (Triton's tutorial): every case without the mask fails
    causal_only = [row(causal=True), row(causal=True, seqlen_q=128, seqlen_k=128)]
    plain_wrong = [row({"dk": 228.0}, seqlen_q=n, seqlen_k=n) for n in (64, 128)]
    r = refusal(causal_only + plain_wrong, [(f.case_id, ["dk"]) for f in plain_wrong], "mine")
    assert r.narrowing == "non_causal = false"
    # a kernel that raises on GQA: its key; a failure no key separates: the general advice
    gqa = [row(status=Status.ERROR, reason="no GQA", heads_kv=k) for k in (1, 2)]
    assert refusal(passing[:2] + gqa, [(f.case_id, ["error"]) for f in gqa], "mine").narrowing == "gqa = false"
    plain = [row({"dq": 3.0}, seqlen_q=32, seqlen_k=32)]
    r = refusal(passing + plain, [(plain[0].case_id, ["dq"])], "mine")
    assert r.narrowing == ""
    text = r.text("b.json", "mine", "redo", "pyproject.toml", None, True)
    assert "declare what it supports in [tool.attn-gate.kernels.mine.supports] so they SKIP" in text
    # a built-in kernel's envelope is attn-gate's: two ways forward, no table to write
    built_in = r.text("b.json", "sdpa-flash", "redo", "pyproject.toml", None, False).splitlines()
    assert not any("narrow the envelope" in line for line in built_in)
    assert built_in[built_in.index("the way forward, one of:") + 2].startswith("  2. record them as known failures")


def test_check_lines_one_per_case_worst_first_headroom_and_inconclusive_last():
    from gate.compare.findings import STATUS, Finding, Severity, Subject
    from gate.report.failures import check_lines

    bad = row({"dk": 3.0}, seqlen_q=64)
    grown = row(seqlen_q=96)  # within its bound, grown past the headroom limit
    lost = row(seqlen_q=160)
    findings = [
        Finding(
            "tolerance",
            Severity.FAIL,
            bad.case_id,
            Subject.ratio("dk"),
            0.4,
            3.0,
            1.0,
            f"{bad.case_id}: dk error is 3 x its bound",
        ),
        Finding("status", Severity.FAIL, bad.case_id, STATUS, "PASS", "FAIL", None, f"{bad.case_id} newly fails: dk"),
        Finding(
            "headroom",
            Severity.FAIL,
            grown.case_id,
            Subject.ratio("dk"),
            0.2,
            0.9,
            0.4,
            f"{grown.case_id}: dk ratio grew",
        ),
        Finding(
            "tensor_dropped",
            Severity.INCONCLUSIVE,
            lost.case_id,
            Subject.ratio("lse"),
            0.2,
            None,
            None,
            f"{lost.case_id}: lse was measured in the baseline, not any more, so it is not validated; accept it",
        ),
        Finding("improvement", Severity.WARN, lost.case_id, Subject.ratio("dq"), 0.5, 0.1, 0.25, "not blocking"),
    ]
    lines = check_lines(findings, {r.case_id: r for r in (bad, grown, lost)})
    assert [x.text for x in lines] == [
        f"FAIL {bad.case_id}  dk 3x its bound",
        f"FAIL {grown.case_id}  dk 0.2 -> 0.9 of its bound (headroom)",
        f"INCONCLUSIVE {lost.case_id}  lse was measured in the baseline, not any more, so it is not validated",
    ]


def test_a_declarations_reason_says_no_answer_for_an_error_not_past_the_bound():
    from gate.report.failures import FailGroup, FailLine, block_reasons

    def group(names, value):
        return FailGroup("head_dim", value, names, ("c",), 1, FailLine("ERROR", "c", "x"))

    reasons = block_reasons(
        [group(("error",), "batch 16385"), group(("dq",), "shifted inputs"), group(("dk", "error"), "head dim 8")]
    )
    assert reasons[("error",)] == "no answer from the kernel on batch 16385"
    assert reasons[("dq",)] == "dq past the bound on shifted inputs"
    assert reasons[("dk", "error")] == "dk past the bound and no answer from the kernel on head dim 8"
