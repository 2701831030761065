"""Decode and paged regimes as suite axes: a one-token decode with a window, a softcap, fp16, MHA,
d64 and d128; a paged non-causal call with a left window only and fewer queries than keys; NaN in
the cache before the window (`nan_before_window`). Each has a planted bug (gate/correctness/planted.py)
that `attn-gate selftest` kills on the new smoke blocks and that passes the cases smoke had before
(its closest relatives run through the same bug and PASS); the correct CPU kernels pass every new case."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gate.attention.inputs import make_inputs
from gate.attention.kvcache import gather_dense
from gate.commands.main import main
from gate.core.cases import NAN_MARGIN, Case, default_suite_specs, expand_suite, first_visible_key, load_suite
from gate.core.config import ToleranceConfig
from gate.core.results import Status
from gate.correctness.planted import BUGS, TiledVariant, host_of, planted_adapter
from gate.correctness.run_case import decode_call, measure_exact, run_case
from gate.kernels.registry import get_adapter
from gate.kernels.tiled import TiledAdapter

TOL = ToleranceConfig()
SMOKE = load_suite("smoke")
KNOB_BLOCKS = 2  # the kernel-knob blocks close the smoke suite (tests/test_coverage_knobs.py)
EXTREMES_BLOCKS = 8  # the extreme-magnitude and crossing blocks come right before them
NEW_BLOCKS = 3  # the decode and paged blocks come right before those
BLOCKS = default_suite_specs()["smoke"]["matrix"]
DECODE = slice(len(BLOCKS) - KNOB_BLOCKS - EXTREMES_BLOCKS - NEW_BLOCKS, len(BLOCKS) - KNOB_BLOCKS - EXTREMES_BLOCKS)
NEW = expand_suite("new", {"seeds": [0], "matrix": BLOCKS[DECODE]}, "suites.toml").cases
OLD = expand_suite("old", {"seeds": [0, 1], "matrix": BLOCKS[: DECODE.start]}, "suites.toml").cases
NEW_IDS = {c.id for c in NEW}

# bug -> (the new cases it must FAIL, by id predicate; old smoke cases nearest its axis that it must PASS)
PLANTED = {
    "decode_window_one_short": (
        lambda c: c.seqlen_q == 1 and c.has_window,
        (
            "fp16-b2-h4/2-s4x96-d64-win16.0-kv50.80-append-page16-shuffled",  # a windowed decode of 4 tokens
            "bf16-b2-h2-s100-d32-causal-win24.0",  # a dense window
            "bf16-b2-h8/2-s1x300-d64",  # a dense one-token step
        ),
    ),
    "paged_window_top_left": (
        lambda c: c.entry.page_size and not c.causal and c.window[1] < 0,
        (
            "bf16-b2-h2-s96x128-d32-win16.-1",  # the same left-only window, dense, fewer queries than keys
            "fp16-b2-h4/2-s4x96-d64-win16.0-kv50.80-append-page16-shuffled",  # paged, window [16, 0]
            "bf16-b3-h4/2-s5x100-d64-causal-kv33.90.0-append-page16-shuffled",  # paged, causal
        ),
    ),
    "reads_before_window": (
        lambda c: c.entry.nan_before_window,
        (
            "fp16-b2-h4/2-s4x96-d64-win16.0-kv50.80-append-page16-shuffled",  # a windowed decode, garbage after it
            "fp16-b2-h4/2-s4x96-d64-win16.0-cap25-kv50.80-append-page16-shuffled",
        ),
    ),
}


def _bug(name: str):
    return next(b for b in BUGS if b.name == name)


def _planted(name: str):
    bug, sdpa = _bug(name), get_adapter("sdpa-cpu")
    return planted_adapter(bug, sdpa if host_of(bug, sdpa) == "kernel" else TiledAdapter())


def test_smoke_ends_with_the_decode_blocks_and_carries_each_regime():
    assert NEW_IDS <= {c.id for c in SMOKE.cases} and not NEW_IDS & {c.id for c in OLD}
    one_token = [c for c in NEW if c.entry.kind == "kvcache" and c.seqlen_q == 1 and not c.entry.nan_before_window]
    assert any(c.has_window for c in one_token) and any(c.softcap for c in one_token)
    assert {c.dtype for c in one_token} == {"bf16", "fp16"} and {c.head_dim for c in one_token} == {64, 128}
    assert any(not c.is_gqa for c in one_token) and any(c.is_gqa for c in one_token)
    # the window's first key is past some cached key: the boundary is inside the cache
    assert all(max(c.key_lengths) > c.window[0] + 1 for c in one_token if c.has_window)
    paged_left = [c for c in NEW if c.entry.page_size and not c.causal and c.window[0] >= 0 and c.window[1] < 0]
    assert paged_left and all(c.seqlen_q > 1 and c.seqlen_q < min(c.key_lengths) for c in paged_left)
    nan = [c for c in NEW if c.entry.nan_before_window]
    assert {bool(c.entry.page_size) for c in nan} == {False, True} and {c.seqlen_q for c in nan} == {1, 8}
    # the smoke suite had none of these before
    old_one_token = [c for c in OLD if c.entry.kind == "kvcache" and c.seqlen_q == 1]
    assert not [c for c in old_one_token if c.has_window or c.softcap or c.head_dim != 64 or not c.is_gqa]
    assert not [c for c in OLD if c.entry.page_size and not c.causal and c.window[1] < 0]


@pytest.mark.parametrize("case", [c for c in NEW if c.entry.nan_before_window], ids=lambda c: c.id)
def test_nan_slots_lie_before_every_key_block_that_reaches_the_window(case):
    """NaN exactly in each element's first Case.nan_slots tokens (whole pages when paged), at least
    NAN_MARGIN keys before its window's first key; every other value as drawn without the axis."""
    poisoned = make_inputs(case, 0, "cpu").cache
    plain = make_inputs(case.with_fields(nan_before_window=False), 0, "cpu").cache
    assert any(case.nan_slots)
    for b, ((k, v), (k0, v0)) in enumerate(
        zip(
            gather_dense(poisoned, poisoned.k_cache, poisoned.v_cache),
            gather_dense(plain, plain.k_cache, plain.v_cache),
        )
    ):
        n = case.nan_slots[b]
        first = first_visible_key(case.seqlen_q, k.shape[0], case.window)
        assert n <= first - NAN_MARGIN or n == 0
        assert n % (case.entry.page_size or 1) == 0
        for t, t0 in ((k, k0), (v, v0)):
            assert torch.isnan(t[:n]).all() and not torch.isnan(t[n:]).any()
            assert torch.equal(t[n:], t0[n:])
    # the slots past each length, and the spare blocks, are the garbage they were
    assert torch.equal(torch.isnan(poisoned.k_cache).sum(), torch.tensor(sum(case.nan_slots) * case.heads_kv * 64))


def test_the_exact_cache_check_takes_a_nan_slot_left_as_nan_for_unchanged():
    expected = torch.tensor([float("nan"), 1.0, 2.0], dtype=torch.bfloat16)
    assert measure_exact("k_cache", expected.clone(), expected, "bf16", 0).ratio == 0.0
    for written in ([0.0, 1.0, 2.0], [float("nan"), float("nan"), 2.0], [float("nan"), 1.5, 2.0]):
        got = torch.tensor(written, dtype=torch.bfloat16)
        assert measure_exact("k_cache", got, expected, "bf16", 0).ratio > 1, written


@pytest.mark.parametrize(
    "fields, words",
    [
        (dict(window=(-1, -1)), "nan_before_window needs a left window"),
        (dict(seqlen_k=200, cache_seqlens=(150, 120)), "nan_before_window needs a left window"),
        (dict(entry="dense", cache_seqlens=None, cache_new=False, batch=2), 'need entry = "kvcache"'),
    ],
)
def test_nan_before_window_without_a_poisoned_slot_is_refused(fields, words):
    base = dict(
        batch=2,
        seqlen_q=1,
        seqlen_k=400,
        heads_q=4,
        heads_kv=2,
        head_dim=64,
        head_dim_v=64,
        dtype="bf16",
        entry="kvcache",
        cache_seqlens=(390, 120),
        cache_new=True,
        window=(32, 0),
        causal=True,
        nan_before_window=True,
    )
    assert Case.build(**base).nan_slots == (102, 0)
    with pytest.raises(ValueError, match=words):
        Case.build(**{**base, **fields})


@pytest.mark.parametrize("kernel", ["sdpa-cpu", "tiled"])
@pytest.mark.parametrize("case", NEW, ids=lambda c: c.id)
def test_correct_cpu_kernels_pass_every_new_case(kernel, case):
    result = run_case(get_adapter(kernel), case, "cpu", TOL)
    if kernel == "sdpa-cpu" and case.softcap:
        assert result.status is Status.SKIP and result.reason == "no softcap"
        return
    assert result.status is Status.PASS, result.reason
    assert all(math.isfinite(t.ratio) and t.ratio < 1 for t in result.tensors)


def test_a_kernel_reading_from_key_zero_meets_the_nan():
    """The axis has teeth by itself: the cache's NaN reaches out when every key is read and masked."""
    case = next(c for c in NEW if c.entry.nan_before_window and c.entry.page_size)
    cache = make_inputs(case, 0, "cpu").cache
    k, v = gather_dense(cache, cache.k_cache, cache.v_cache)[0]
    weights = torch.zeros(k.shape[0])  # the masked keys' probabilities, exactly 0
    weights[-1] = 1.0
    assert torch.isnan(weights @ v[:, 0].float()).all()


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_bug_fails_its_new_cases_and_passes_the_old_ones_nearest_its_axis(name):
    targets, controls = PLANTED[name]
    bug, adapter = _bug(name), _planted(name)
    exercised = [c for c in NEW if bug.trigger.applies(c)]
    assert {c.id for c in exercised} == {c.id for c in NEW if targets(c)}
    assert not [c.id for c in OLD if bug.trigger.applies(c)]  # the suite before the new blocks never sees it
    ran = 0
    for case in exercised:
        result = run_case(adapter, case, "cpu", TOL)
        if result.status is Status.SKIP:  # sdpa-cpu has no softcap
            assert result.reason == "no softcap", (case.id, result.reason)
            continue
        ran += 1
        assert result.status is Status.FAIL, (case.id, result.reason)
    assert ran >= 1
    old = {c.id: c for c in OLD}
    for case_id in controls:
        result = run_case(adapter, old[case_id], "cpu", TOL)
        assert result.status is Status.PASS, (case_id, result.reason)


def _suite_toml(name: str, blocks: list[dict]) -> str:
    def value(x) -> str:
        if isinstance(x, bool):
            return "true" if x else "false"
        if isinstance(x, list):
            return "[" + ", ".join(value(y) for y in x) + "]"
        if isinstance(x, dict):  # an inline table (a knobs value)
            return "{" + ", ".join(f"{k} = {value(y)}" for k, y in x.items()) + "}"
        return json.dumps(x)

    text = f"[tool.attn-gate.suites.{name}]\nseeds = [0]\n"
    for block in blocks:
        text += f"[[tool.attn-gate.suites.{name}.matrix]]\n"
        text += "".join(f"{key} = {value(x)}\n" for key, x in block.items())
    return text


@pytest.mark.slow
def test_selftest_kills_each_bug_on_the_new_blocks_and_finds_no_case_for_it_before(tmp_path, capsys):
    """Through `attn-gate selftest`: KILLED on a suite of the new blocks; on the decode and window
    blocks smoke had before, NOT_EXERCISED (the controls' relatives above PASS the bug)."""
    old_blocks = [b for b in BLOCKS[: DECODE.start] if b.get("entry") == ["kvcache"] or "window" in b]
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.attn-gate]\n" + _suite_toml("new", BLOCKS[DECODE]) + _suite_toml("old", old_blocks))
    names = ",".join(sorted(PLANTED))
    for suite, status, code in (("new", "KILLED", 0), ("old", "NOT_EXERCISED", 1)):
        out = tmp_path / suite
        args = ["selftest", "--device", "cpu", "--suite", suite, "--config", str(config), "--out", str(out)]
        assert main([*args, "--bugs", names, "--no-slowdowns"]) == code, capsys.readouterr()
        report = json.loads((out / "selftest.json").read_text())
        assert {b["name"]: b["status"] for b in report["bugs"]} == dict.fromkeys(PLANTED, status)


@pytest.mark.parametrize("case", [c for c in NEW if c.entry.page_size or not c.causal], ids=lambda c: c.id)
def test_tiled_variants_of_the_new_bugs_are_tiled_where_their_regime_is_absent(case):
    """A tiled variant with no flag is tiled on a decode call too; window_top_left only moves a paged
    non-causal left-window call, reads_before_window only one whose cache holds NaN."""
    inputs = make_inputs(case, 0, "cpu")
    ref = TiledAdapter()(decode_call(case, inputs))
    for flags in ((), ("window_top_left",), ("reads_before_window",)):
        got = TiledVariant(frozenset(flags))(decode_call(case, inputs))  # raw: a NaN out is an answer here
        same = torch.equal(ref.out, got.out) and torch.equal(ref.lse, got.lse)
        moved = (flags == ("window_top_left",) and bool(case.entry.page_size) and not case.causal) or (
            flags == ("reads_before_window",) and case.entry.nan_before_window
        )
        assert same != moved, (flags, case.id)
