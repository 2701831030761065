"""The anchor fallback (`[tool.attn-gate.perf] anchor_fallback`): a perf case the anchor cannot run
is timed against a matmul of equal FLOPs instead of being a SKIP row. On the H200 the cuDNN anchor
refuses head dim 256, so without it the pr suite's d256 perf cases were never timed.

On the CPU the anchor that refuses is a user kernel without a `softcap` parameter
(tests.verdict_kernels:sdpa_ok): a softcap perf case falls back, a plain one does not. The row, the
baseline entry and the judgement all carry the anchor the case was really timed against, so a
baseline and a check agree, and a baseline made against another anchor is INCONCLUSIVE, not compared."""

from __future__ import annotations

from pathlib import Path

from gate.core.cases import Case
from gate.core.config import PerfConfig, load_config
from gate.kernels.registry import get_adapter, kernel_entry
from gate.speed.rule import PerfSeverity
from gate.speed.runs import (
    MATMUL,
    PerfCaseResult,
    PerfTarget,
    baseline_entry,
    case_anchor,
    judge_perf,
    measure_case,
    run_perf_here,
)
from gate.speed.timing import TimingPlan
from tests.test_perf_check import write_config

REFUSING_ANCHOR = "tests.verdict_kernels:sdpa_ok"  # no softcap parameter: SKIPs softcap cases
PLAIN = Case.build(
    batch=1, seqlen_q=32, seqlen_k=32, heads_q=2, heads_kv=2, head_dim=16, head_dim_v=16, dtype="fp32", seeds=(0,)
)

# the perf-check tests' project (tests/test_perf_check.py), plus a suite with a softcap perf case
CAPPED_SUITE = """anchor_fallback = "{fallback}"

[tool.attn-gate.suites.capped]
seeds = [0]

[[tool.attn-gate.suites.capped.matrix]]
dtype = ["fp32"]
batch = [1]
seqlens = ["32"]
heads = ["2"]
head_dims = ["16"]
softcap = [0.0, 20.0]
perf = [true]
"""


def capped(case: Case) -> Case:
    return case.with_fields(softcap=20.0)


def config(tmp_path: Path, fallback: str = "matmul"):
    return load_config(write_config(tmp_path, CAPPED_SUITE.format(fallback=fallback)))


def perf(tmp_path: Path, fallback: str = "matmul"):
    """tiled (which runs softcap) timed on the capped suite against the anchor that refuses it."""
    cfg = config(tmp_path, fallback)
    target = PerfTarget.of("tiled", cfg.suite("capped"), cfg.perf, "cpu", REFUSING_ANCHOR)
    return cfg, run_perf_here(target, kernel_entry("tiled", cfg).adapter())


def test_a_case_the_anchor_refuses_gets_the_fallback_and_only_that_case():
    from gate.speed.runs import anchor_adapter

    assert anchor_adapter(REFUSING_ANCHOR).unsupported_reason(capped(PLAIN), "cpu")  # the premise: it refuses softcap
    on, off = PerfConfig(anchor_fallback="matmul"), PerfConfig(anchor_fallback="")
    assert case_anchor(REFUSING_ANCHOR, on, capped(PLAIN), "cpu") == MATMUL
    assert case_anchor(REFUSING_ANCHOR, on, PLAIN, "cpu") == REFUSING_ANCHOR
    assert case_anchor(REFUSING_ANCHOR, off, capped(PLAIN), "cpu") == REFUSING_ANCHOR
    assert case_anchor("tiled", on, capped(PLAIN), "cpu") == "tiled"  # an anchor that runs it keeps it


def test_run_perf_times_the_refused_case_against_matmul_and_records_it(tmp_path):
    cfg, result = perf(tmp_path)
    rows = {c.case.softcap: c for c in result.cases}
    assert result.anchor == REFUSING_ANCHOR
    assert rows[0.0].label == "OK" and rows[0.0].anchor == REFUSING_ANCHOR
    assert rows[20.0].label == "OK" and rows[20.0].anchor == MATMUL, rows[20.0].reason
    entries = {c.case_id: baseline_entry(c, result.anchor, result.host) for c in result.cases}
    assert entries[rows[20.0].case_id]["anchor"] == MATMUL
    assert entries[rows[0.0].case_id]["anchor"] == REFUSING_ANCHOR
    # a baseline made the same way judges every pass of both cases (none INCONCLUSIVE for its anchor)
    judged = judge_perf(result, entries, cfg.perf)
    assert {j.case_id for j in judged} == set(entries)
    assert not [j for j in judged if "anchor" in j.message], [j.message for j in judged]
    # a baseline that timed the softcap case against the run's anchor is another measurement: not compared
    doctored = dict(entries)
    doctored[rows[20.0].case_id] = {**entries[rows[20.0].case_id], "anchor": REFUSING_ANCHOR}
    mismatched = [j for j in judge_perf(result, doctored, cfg.perf) if j.case_id == rows[20.0].case_id]
    assert mismatched and all(j.severity is PerfSeverity.INCONCLUSIVE for j in mismatched)
    assert all("'matmul'" in j.message and REFUSING_ANCHOR in j.message for j in mismatched)


def test_without_the_fallback_the_refused_case_is_a_skip_row_naming_the_anchor(tmp_path):
    _, result = perf(tmp_path, fallback="")
    row = next(c for c in result.cases if c.case.softcap)
    assert row.status == "SKIP" and f"anchor {REFUSING_ANCHOR} cannot run this case" in row.reason


def test_a_row_keeps_its_anchor_through_json_and_an_old_row_reads_as_the_runs():
    row = measure_case(
        get_adapter("sdpa-cpu"), MATMUL, PLAIN, "cpu", TimingPlan(rounds=1, calls_per_round=1, warmup_s=0.0)
    )
    again = PerfCaseResult.from_dict(row.to_dict())
    assert again.anchor == MATMUL == row.anchor
    old = row.to_dict()
    del old["anchor"]  # a file written before the fallback existed
    assert PerfCaseResult.from_dict(old).anchor_or("sdpa-math") == "sdpa-math"


def test_a_crashed_fallback_row_is_judged_not_measured_rather_than_on_its_anchor(tmp_path):
    """An ERROR row (a worker that died) says why it was not measured; it is not blamed on an anchor
    mismatch, whose advice (refresh the baseline) would drop the case from the baseline."""
    cfg, result = perf(tmp_path)
    entries = {c.case_id: baseline_entry(c, result.anchor, result.host) for c in result.cases}
    import dataclasses

    crashed = tuple(
        dataclasses.replace(c, status="ERROR", reason="case x: the worker died (SIGSEGV)", timing=None, anchor="")
        if c.case.softcap
        else c
        for c in result.cases
    )
    judged = [
        j
        for j in judge_perf(dataclasses.replace(result, cases=crashed), entries, cfg.perf)
        if j.case_id == next(c.case_id for c in crashed if c.case.softcap)
    ]
    assert judged and all(j.severity is PerfSeverity.INCONCLUSIVE for j in judged)
    assert all("not measured: case x: the worker died" in j.message and "anchor" not in j.message for j in judged)


def test_asv_keeps_the_ms_but_not_the_ratio_of_a_fallback_case(tmp_path):
    """One asv history line is one kernel against one anchor: a ratio against the fallback
    must not be filed under the run's anchor; the kernel's own time still is."""
    from gate.speed.asv import BenchSettings, bench_measure

    write_config(tmp_path, CAPPED_SUITE.format(fallback="matmul"))
    rows = bench_measure(
        BenchSettings(
            config_path=tmp_path / "pyproject.toml",
            kernel="tiled",
            suite="capped",
            anchor=REFUSING_ANCHOR,
            device="cpu",
            only=None,
            rounds=None,
        )
    )
    plain, capped_row = (rows[next(i for i in rows if ("cap" in i) == want)] for want in (False, True))
    for p in ("fwd", "bwd"):
        assert "speed_ratio" in plain[p] and "candidate_ms" in plain[p]
        assert not {"speed_ratio", "anchor_ms", "noise", "ci95"} & set(capped_row[p])
        assert capped_row[p]["candidate_ms"] > 0
