"""The entry-point plumbing every adapter shares (gate/kernels/base.py): which entry point a call
is for, each varlen sequence's own dropout seed, and the append of kernels without a KV-cache API."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gate.attention.inputs import make_inputs
from gate.core.cases import Case
from gate.correctness.run_case import leaf_call
from gate.kernels.base import (
    KernelOutput,
    append_new_tokens,
    entry_kind,
    per_sequence_seeded,
    read_pages,
)
from gate.kernels.tiled import TiledAdapter, dropout_keep_mask

BASE = dict(batch=2, seqlen_q=12, seqlen_k=12, heads_q=2, heads_kv=1, head_dim=16, head_dim_v=16, dtype="fp32")
DECODE = dict(
    BASE,
    batch=3,
    seqlen_q=2,
    seqlen_k=40,
    entry="kvcache",
    cache_seqlens=(5, 20, 0),
    cache_new=True,
    page_size=8,
    shuffled_pages=True,
)


def call_of(**kw):
    kw = {**BASE, "seeds": (3,), **kw}
    if kw.get("varlen"):
        kw.update(batch=len(kw["varlen"]), seqlen_q=max(kw["varlen"]), seqlen_k=max(kw["varlen"]))
    case = Case.build(**kw)
    return leaf_call(case, make_inputs(case, 3, "cpu"))


@pytest.mark.parametrize(
    "kw, kind",
    [(dict(), "dense"), (dict(varlen=(4, 0, 9)), "varlen"), (DECODE, "kvcache")],
    ids=["dense", "varlen", "kvcache"],
)
def test_a_call_goes_to_the_entry_point_of_its_kind(kw, kind):
    assert entry_kind(call_of(**kw)) == kind


def test_a_decode_call_is_kvcache_even_with_lengths_beside_it():
    call = call_of(**DECODE)
    assert entry_kind(dataclasses.replace(call, cu_seqlens=torch.tensor([0, 2], dtype=torch.int32))) == "kvcache"


def test_each_nonempty_sequence_draws_from_its_own_seed():
    call = call_of(varlen=(5, 0, 9, 3), dropout_p=0.3)
    seen = []

    def dense(q, k, v, seq_call, seed):
        seen.append((q.shape[1], seed))
        return KernelOutput(out=torch.zeros(*q.shape[:-1], v.shape[-1]))

    out = per_sequence_seeded(call, dense).out
    assert seen == [(5, call.seed), (9, call.seed + 1), (3, call.seed + 2)], "empty sequences draw no seed"
    assert out.shape[0] == 17


def test_tiled_varlen_dropout_masks_come_from_those_seeds():
    call = call_of(varlen=(5, 0, 9), dropout_p=0.4)
    keep = TiledAdapter()(call).dropout_keep
    assert keep[1] is None
    for mask, n, seed in ((keep[0], 5, call.seed), (keep[2], 9, call.seed + 1)):
        assert torch.equal(mask, dropout_keep_mask((1, 2, n, n), 0.4, seed, "cpu"))
    assert not torch.equal(keep[0][..., :5, :5], keep[2][..., :5, :5])


def test_the_append_writes_each_element_s_new_tokens_at_its_cached_length_on_its_pages():
    c = call_of(**DECODE).cache
    before = c.k_cache.clone()
    append_new_tokens(c)
    for b, cached in enumerate(c.cached):
        n = c.k_new.shape[1]
        got = read_pages(c.k_cache, c.block_table, c.page_size, b, cached, cached + n)
        assert torch.equal(got, c.k_new[b]), f"element {b}"
        assert torch.equal(read_pages(c.v_cache, c.block_table, c.page_size, b, cached, cached + n), c.v_new[b])
        old = read_pages(before, c.block_table, c.page_size, b, 0, cached)
        assert torch.equal(read_pages(c.k_cache, c.block_table, c.page_size, b, 0, cached), old), "cached tokens kept"
    assert int((c.k_cache != before).any(dim=(-1, -2)).sum()) <= sum(1 for _ in c.cached) * c.k_new.shape[1]


def test_no_new_tokens_no_write():
    c = call_of(**{**DECODE, "cache_new": False}).cache
    before = c.k_cache.clone()
    append_new_tokens(c)
    assert torch.equal(c.k_cache, before)


def test_sdpa_varlen_hands_each_sequence_its_seed(monkeypatch):
    """SDPA's flash dropout seeds each sequence (a GPU path): the seed reaches its dense call."""
    from gate.kernels.sdpa import SdpaAdapter

    adapter, seen = SdpaAdapter("cpu"), []
    dense = adapter._dense
    monkeypatch.setattr(adapter, "_dense", lambda q, k, v, call, seed=None: seen.append(seed) or dense(q, k, v, call))
    call = call_of(varlen=(4, 0, 7))
    adapter(call)
    assert seen == [call.seed, call.seed + 1]
