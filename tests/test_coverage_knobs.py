"""Kernel knobs as a case part: a forced split-KV (num_splits), packed GQA rows (pack_gqa) and an HND
cache (kv_layout), on the two smoke blocks that close the smoke suite. Each has a planted bug
(gate/correctness/planted.py, "kernel knobs") in tiled's own implementation of the knob that the
selftest kills on those blocks and that passes the decode cases smoke had before (they run the
same bug and PASS: the knob's path is never taken); tiled passes every new case, sdpa-cpu (no
knobs) SKIPs each with the knob it does not expose."""

from __future__ import annotations

import json

import pytest
import torch

from gate.attention.inputs import make_inputs
from gate.commands.main import main
from gate.core.cases import default_suite_specs, expand_suite, load_suite
from gate.core.config import ToleranceConfig
from gate.core.results import Status
from gate.correctness.planted import BUGS, TiledVariant, host_of, planted_adapter
from gate.correctness.run_case import decode_call, run_case
from gate.kernels.registry import get_adapter
from gate.kernels.tiled import TiledAdapter, split_spans
from tests.test_coverage_decode import _suite_toml

TOL = ToleranceConfig()
KNOB_BLOCKS = 2  # the kernel-knob blocks close the smoke suite
BLOCKS = default_suite_specs()["smoke"]["matrix"]
NEW = expand_suite("new", {"seeds": [0], "matrix": BLOCKS[-KNOB_BLOCKS:]}, "suites.toml").cases
OLD = expand_suite("old", {"seeds": [0, 1], "matrix": BLOCKS[:-KNOB_BLOCKS]}, "suites.toml").cases
SDPA_REASONS = {
    "num_splits": "no num_splits knob: the kernel exposes no forced split-KV count",
    "pack_gqa": "no pack_gqa knob: the kernel exposes no forced packing of GQA query heads",
    "kv_layout": "no HND cache layout: the kernel exposes no kv_layout knob (it reads NHD caches only)",
}

# bug -> (the new cases it must FAIL, by predicate; old decode cases nearest its axis that it must PASS)
PLANTED = {
    "split_combine_lse_transposed": (
        lambda c: c.knobs.num_splits >= 2 and c.seqlen_q >= 2 and (c.heads_kv if c.knobs.pack_gqa else c.heads_q) >= 2,
        (
            "bf16-b2-h4/2-s7x96-d64-causal-kv17.80-append",  # a multi-token decode, unsplit
            "bf16-b2-h4/2-s3x96-d64-causal-kv17.80-append-page16-sinks",
        ),
    ),
    "pack_gqa_second_sequence_unwritten": (
        lambda c: c.knobs.pack_gqa is True,
        (
            "bf16-b2-h4/2-s7x96-d64-causal-kv17.80-append",  # two batch elements, GQA, heads unpacked
            "bf16-b3-h4/2-s5x100-d64-causal-kv33.90.0-append-page16-shuffled",
        ),
    ),
    "hnd_cache_read_as_nhd": (
        lambda c: c.knobs.kv_layout == "HND" and c.heads_kv >= 2,
        (
            "bf16-b3-h4/2-s5x100-d64-causal-kv33.90.0-append-page16-shuffled",  # an NHD paged cache
            "bf16-b2-h4/2-s7x96-d64-causal-kv17.80-append",
        ),
    ),
}


def _planted(name: str):
    bug, sdpa = next(b for b in BUGS if b.name == name), get_adapter("sdpa-cpu")
    return bug, planted_adapter(bug, sdpa if host_of(bug, sdpa) == "kernel" else TiledAdapter())


def test_smoke_ends_with_the_knob_blocks_and_forces_each_knob():
    assert {c.id for c in NEW} <= {c.id for c in load_suite("smoke").cases}
    assert all(c.knobs.forced and c.entry.kind == "kvcache" for c in NEW)
    assert not [c.id for c in OLD if c.knobs.forced]  # smoke had none before
    assert {c.knobs.num_splits for c in NEW} >= {0, 3, 4}
    assert {c.knobs.pack_gqa for c in NEW} == {None, True, False} and {c.knobs.kv_layout for c in NEW} == {"NHD", "HND"}
    # each knob on a multi-token step and a contiguous and a paged cache; one-token and MQA forms beside
    for forced in (lambda c: c.knobs.num_splits, lambda c: c.knobs.pack_gqa, lambda c: c.knobs.kv_layout == "HND"):
        cases = [c for c in NEW if forced(c)]
        assert {bool(c.entry.page_size) for c in cases} == {False, True}
        assert any(c.seqlen_q >= 2 for c in cases) and any(c.heads_kv == 1 for c in cases)


@pytest.mark.parametrize("case", NEW, ids=lambda c: c.id)
def test_tiled_passes_every_knob_case_and_sdpa_cpu_skips_each_naming_its_knob(case):
    result = run_case(TiledAdapter(), case, "cpu", TOL)
    assert result.status is Status.PASS, result.reason
    assert all(t.ratio < 1 for t in result.tensors)
    skipped = run_case(get_adapter("sdpa-cpu"), case, "cpu", TOL)
    k = case.knobs
    forced = {"num_splits": k.num_splits != 0, "pack_gqa": k.pack_gqa is not None, "kv_layout": k.kv_layout != "NHD"}
    first = next(name for name, on in forced.items() if on)
    assert skipped.status is Status.SKIP and skipped.reason == SDPA_REASONS[first]


@pytest.mark.parametrize("case", NEW, ids=lambda c: c.id)
def test_a_tiled_variant_without_flags_is_tiled_on_every_knob_path(case):
    inputs = make_inputs(case, 0, "cpu")
    ref, got = TiledAdapter()(decode_call(case, inputs)), TiledVariant()(decode_call(case, inputs))
    assert torch.equal(ref.out, got.out) and torch.equal(ref.lse, got.lse)


def test_the_splits_deal_the_key_tiles_in_runs_and_surplus_splits_are_empty():
    assert split_spans(0, 155, 1) == [(0, 155)]
    assert split_spans(0, 155, 3) == [(0, 64), (64, 128), (128, 155)]
    assert split_spans(64, 300, 2) == [(64, 192), (192, 300)]
    spans = split_spans(0, 38, 4)
    assert len(spans) == 4 and [z - a for a, z in spans if z > a] == [38]
    assert split_spans(0, 0, 3) == [(0, 0)] * 3


def test_the_split_path_is_its_own_arithmetic_and_agrees_with_the_unsplit_one():
    """The knob reaches tiled: a forced split sums in another order (not bit-identical) to within
    float32 rounding of the one-pass decode, the LSE included."""
    case = next(c for c in NEW if c.knobs.num_splits and c.seqlen_q >= 2 and not c.knobs.pack_gqa)
    plain = case.with_fields(num_splits=0)
    inputs = make_inputs(case, 0, "cpu")
    split, whole = TiledAdapter()(decode_call(case, inputs)), TiledAdapter()(decode_call(plain, inputs))
    assert not torch.equal(split.lse, whole.lse)
    torch.testing.assert_close(split.lse, whole.lse, rtol=0, atol=1e-5)
    torch.testing.assert_close(split.out.float(), whole.out.float(), rtol=0, atol=2e-2)


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_bug_fails_its_new_cases_and_passes_the_old_ones_nearest_its_axis(name):
    targets, controls = PLANTED[name]
    bug, adapter = _planted(name)
    exercised = [c for c in NEW if bug.trigger.applies(c)]
    assert exercised and {c.id for c in exercised} == {c.id for c in NEW if targets(c)}
    assert not [c.id for c in OLD if bug.trigger.applies(c)]  # the suite before the knob blocks never sees it
    for case in NEW:  # FAIL where it is exercised; where its knob's path is not taken, tiled itself
        result = run_case(adapter, case, "cpu", TOL)
        expected = Status.FAIL if case in exercised else Status.PASS
        assert result.status is expected, (case.id, result.reason)
    old = {c.id: c for c in OLD}
    for case_id in controls:
        result = run_case(adapter, old[case_id], "cpu", TOL)
        assert result.status is Status.PASS, (case_id, result.reason)


@pytest.mark.slow
def test_selftest_kills_each_bug_on_the_knob_blocks_and_finds_no_case_for_it_before(tmp_path, capsys):
    """Through `attn-gate selftest --kernel tiled`: KILLED on a suite of the knob blocks; on smoke's
    decode blocks before them, NOT_EXERCISED (their relatives above PASS the bug)."""
    old_blocks = [b for b in BLOCKS[:-KNOB_BLOCKS] if b.get("entry") == ["kvcache"]]
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.attn-gate]\n" + _suite_toml("new", BLOCKS[-KNOB_BLOCKS:]) + _suite_toml("old", old_blocks))
    names = ",".join(sorted(PLANTED))
    for suite, status, code in (("new", "KILLED", 0), ("old", "NOT_EXERCISED", 1)):
        out = tmp_path / suite
        # tiled: the knob blocks alone leave sdpa-cpu nothing to measure (it SKIPs every knob case)
        args = ["selftest", "--kernel", "tiled", "--device", "cpu", "--suite", suite, "--config", str(config)]
        args += ["--out", str(out)]
        assert main([*args, "--bugs", names, "--no-slowdowns"]) == code, capsys.readouterr()
        report = json.loads((out / "selftest.json").read_text())
        assert {b["name"]: b["status"] for b in report["bugs"]} == dict.fromkeys(PLANTED, status)
