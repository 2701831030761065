"""The decode caches' values: every committed baseline was measured on these exact
inputs, so a faster way to build them (gate/attention/kvcache.py builds them in place) must
draw the same numbers in the same order. The digests were taken from the builder before it was
rewritten in place; a change to any value (a garbage slot, the page padding, the spare blocks, the
shuffle, an appended token) changes its digest. Those digests are torch's CPU generator's numbers,
so their test is marked `ci_machine`; what holds on any machine (each case's cache layout, the same
seed drawing the same inputs, another seed others) is tested unmarked."""

from __future__ import annotations

import hashlib

import pytest
import torch

from gate.attention.inputs import make_inputs
from gate.core.cases import load_suite


def digest(inputs) -> str:
    h = hashlib.sha256()
    c = inputs.cache
    for t in (
        inputs.q,
        inputs.k,
        inputs.v,
        inputs.dout,
        inputs.sink,
        c.k_cache,
        c.v_cache,
        c.cache_seqlens,
        c.block_table,
        c.k_new,
        c.v_new,
    ):
        h.update(b"-" if t is None else t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _cases() -> dict:
    smoke = [c for c in load_suite("smoke").cases if c.entry.kind == "kvcache"]
    pr = [c for c in load_suite("pr").cases if c.entry.kind == "kvcache" and c.batch < 16]
    base = next(c for c in smoke if c.entry.page_size == 16 and c.entry.shuffled_pages and c.batch == 2)
    full = [
        base.with_fields(cache_seqlens=(96, 96), cache_new=False, seqlen_q=1),  # every slot real, 96 % 16 == 0
        base.with_fields(cache_seqlens=(96, 96), cache_new=False, seqlen_q=1, page_size=0, shuffled_pages=False),
    ]
    return {c.id: c for c in smoke + pr[:4] + pr[8:10] + full}


CASES = _cases()

PINNED = [  # (case id, cache_seqlens, page size, shuffled, digest of make_inputs(case, seed 1) on the CPU)
    ("bf16-b2-h4/2-s1x96-d64-causal-kv17.80", (17, 80), 0, False, "96c2bbe0d1282bf1"),
    ("bf16-b2-h4/2-s1x96-d64-causal-kv17.80-append", (17, 80), 0, False, "b08fed11477d602a"),
    ("bf16-b2-h4/1-s1x96-d64-causal-kv17.80", (17, 80), 0, False, "8b251f25ff317b13"),
    ("bf16-b2-h4/1-s1x96-d64-causal-kv17.80-append", (17, 80), 0, False, "b9e45c5f230375a8"),
    ("bf16-b2-h4/2-s7x96-d64-causal-kv17.80", (17, 80), 0, False, "ca214b6af2d1086a"),
    ("bf16-b2-h4/2-s7x96-d64-causal-kv17.80-append", (17, 80), 0, False, "a643f395322f770e"),
    ("bf16-b2-h4/1-s7x96-d64-causal-kv17.80", (17, 80), 0, False, "b3df3bbc0d87ed87"),
    ("bf16-b2-h4/1-s7x96-d64-causal-kv17.80-append", (17, 80), 0, False, "4aba2224e6e4f45e"),
    ("bf16-b3-h4/2-s5x100-d64-causal-kv33.90.0-append-page16", (33, 90, 0), 16, False, "448f00b7a4c81eed"),
    ("bf16-b3-h4/2-s5x100-d64-causal-kv33.90.0-append-page16-shuffled", (33, 90, 0), 16, True, "5a34073f72d90a5e"),
    ("bf16-b3-h4/2-s5x100-d64-causal-kv33.90.0-append-page7", (33, 90, 0), 7, False, "a3dc787f610d38a7"),
    ("bf16-b3-h4/2-s5x100-d64-causal-kv33.90.0-append-page7-shuffled", (33, 90, 0), 7, True, "22663ee28e4cb86b"),
    ("fp16-b2-h4/2-s4x96-d64-win16.0-kv50.80-append-page16-shuffled", (50, 80), 16, True, "d32829a94df644ea"),
    ("fp16-b2-h4/2-s4x96-d64-win16.0-cap25-kv50.80-append-page16-shuffled", (50, 80), 16, True, "d32829a94df644ea"),
    ("bf16-b2-h4/2-s3x96-d64-causal-kv17.80-append-page16-sinks", (17, 80), 16, False, "452d9868e329e005"),
    ("bf16-b4-h32/8-s1x4096-d128-causal-kv1.1000.4000.33", (1, 1000, 4000, 33), 0, False, "16ed1e7d210e44ef"),
    ("bf16-b4-h32/8-s1x4096-d128-causal-kv1.1000.4000.33-append", (1, 1000, 4000, 33), 0, False, "2a8646b198961139"),
    ("bf16-b4-h32/1-s1x4096-d128-causal-kv1.1000.4000.33", (1, 1000, 4000, 33), 0, False, "eeb7f7a62657627f"),
    ("bf16-b4-h32/1-s1x4096-d128-causal-kv1.1000.4000.33-append", (1, 1000, 4000, 33), 0, False, "f52c835deb2f825d"),
    (
        "bf16-b3-h16/4-s4x4096-d128-causal-kv100.4000.2049-append-page256",
        (100, 4000, 2049),
        256,
        False,
        "77a7f18b752956a6",
    ),
    (
        "bf16-b3-h16/4-s4x4096-d128-causal-kv100.4000.2049-append-page256-shuffled",
        (100, 4000, 2049),
        256,
        True,
        "814d5bd1b86f10fc",
    ),
    ("fp16-b2-h4/2-s1x96-d64-win16.0-kv96.96-page16-shuffled", (96, 96), 16, True, "5ba3ca4354987c2e"),
    ("fp16-b2-h4/2-s1x96-d64-win16.0-kv96.96", (96, 96), 0, False, "7dad5fb3a386cfd9"),
]


@pytest.mark.parametrize("case_id, cached, page, shuffled, want", PINNED, ids=[p[0] for p in PINNED])
def test_each_decode_case_has_its_cache_layout(case_id, cached, page, shuffled, want):
    case = CASES[case_id]
    assert (case.entry.cache_seqlens, case.entry.page_size, case.entry.shuffled_pages) == (cached, page, shuffled)


# every builder path (paged, shuffled, appended, sinks, a full cache) at smoke sizes: pr's take seconds a draw
SMALL = sorted(i for i, c in CASES.items() if c.seqlen_k <= 128)


@pytest.mark.parametrize("case_id", SMALL)
def test_a_seed_draws_the_same_decode_inputs_every_time_and_another_seed_others(case_id):
    case = CASES[case_id]
    first = digest(make_inputs(case, 1, "cpu"))
    assert digest(make_inputs(case, 1, "cpu")) == first
    assert digest(make_inputs(case, 2, "cpu")) != first


@pytest.mark.ci_machine
@pytest.mark.parametrize("case_id, cached, page, shuffled, want", PINNED, ids=[p[0] for p in PINNED])
def test_decode_inputs_are_the_ones_the_baselines_were_measured_on(case_id, cached, page, shuffled, want):
    assert digest(make_inputs(CASES[case_id], 1, "cpu")) == want


def test_the_digest_sees_one_garbage_slot():
    """The pin has teeth: one changed slot past a batch element's tokens changes the digest."""
    case = CASES["bf16-b2-h4/2-s1x96-d64-causal-kv17.80"]
    inputs = make_inputs(case, 1, "cpu")
    before = digest(inputs)
    inputs.cache.k_cache[0, 50, 0, 0] += 1.0
    assert digest(inputs) != before


def test_drawing_on_a_named_device_is_the_same_draw_and_timing_falls_back_to_the_cpu(monkeypatch, capsys):
    """make_inputs(draw_on=D) draws every random value with a generator on D (timing draws on the
    GPU): on the CPU it is exactly the default draw, for every kind of case; and a timing draw that
    fails on the device is made as the sweep makes it, with a note."""
    import gate.attention.inputs as inputs_mod
    from gate.core.cases import Case

    kinds = [
        dict(
            batch=2,
            seqlen_q=37,
            seqlen_k=70,
            heads_q=4,
            heads_kv=2,
            head_dim=32,
            head_dim_v=32,
            dtype="bf16",
            inputs="outliers",
            sinks=True,
        ),
        dict(
            batch=3,
            seqlen_q=2,
            seqlen_k=100,
            heads_q=4,
            heads_kv=2,
            head_dim=32,
            head_dim_v=32,
            dtype="bf16",
            entry="kvcache",
            cache_seqlens=(5, 60, 9),
            cache_new=True,
            page_size=16,
            shuffled_pages=True,
        ),
        dict(batch=2, seqlen_q=33, seqlen_k=65, heads_q=4, heads_kv=2, head_dim=32, head_dim_v=32, dtype="e4m3"),
    ]
    for kw in kinds:
        c = Case.build(**kw)
        a, b = inputs_mod.make_inputs(c, 1, "cpu"), inputs_mod.make_inputs(c, 1, "cpu", draw_on="cpu")
        for name in ("q", "k", "v", "dout", "sink"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None and y is None) or torch.equal(x, y), (c.id, name)
        if a.cache is not None:
            assert torch.equal(a.cache.k_cache, b.cache.k_cache) and torch.equal(
                a.cache.block_table, b.cache.block_table
            )
            assert torch.equal(a.cache.k_new, b.cache.k_new)
        if a.fp8 is not None:
            assert torch.equal(a.fp8.k_descale, b.fp8.k_descale)
    c = Case.build(**kinds[0])
    calls = []

    def fake(case, seed, device, draw_on="cpu"):
        calls.append(str(draw_on))
        if draw_on != "cpu":
            raise RuntimeError("no such device here")
        return "the sweep's draw"

    monkeypatch.setattr(inputs_mod, "make_inputs", fake)
    assert inputs_mod.timing_inputs(c, "cuda") == "the sweep's draw" and calls == ["cuda", "cpu"]
    assert "timing inputs drawn on the CPU (RuntimeError: no such device here)" in capsys.readouterr().err
    assert inputs_mod.timing_inputs(c, "cpu") == "the sweep's draw" and calls[-1] == "cpu"
