"""A user kernel family in plain PyTorch: one entry point per flash-attn convention.

    attn_func          flash_attn_func(q, k, v, ...)                          dense (B, N, H, D)
    attn_varlen_func   flash_attn_varlen_func(q, k, v, cu_seqlens_q, ...)    packed (total, H, D)
    attn_with_kvcache  flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, ...)

All three share `_attend` (float32 softmax attention, bottom-right aligned, with softcap, window
and learnable sinks), so each bug below lives in ONE entry point's own handling:

    attn_varlen_func_overread    reads max_seqlen_k keys from each sequence's start: the next
                                 sequence's keys leak into every shorter sequence
    attn_varlen_func_softcap_ignored    takes softcap and forgets it on the whole varlen path (forward and
                                 backward) while the dense entry point caps: louder than PR #2544
    attn_varlen_func_softcap_backward_dropped  the varlen forward caps, its backward differentiates the
                                 uncapped scores (the tanh's derivative left out): flash-attention PR
                                 #2544's class, softcap x varlen with a wrong backward only
    attn_varlen_func_window_unclamped   a window's left bound taken in packed positions, not clamped at the
                                 sequence's start: a sequence's first rows see the previous sequence's last keys
    attn_varlen_func_seqused_off_by_one reads seqused_k - 1 keys of each sequence (drops its last key)
    attn_with_kvcache_contiguous assumes a sequence's pages are consecutive blocks (block_table[b, 0] + j):
                                 right for an in-order table, wrong for a shuffled one
    attn_with_kvcache_no_append  attends over the new tokens but never writes them into the cache
    attn_with_kvcache_no_window  a decode entry without window_size= or softcap= (the dense one has them)
    attn_with_kvcache_knobs      takes num_splits=, pack_gqa= (recorded in KNOBS_SEEN, the math is one
                                 softmax whatever they say) and kv_layout="HND" (reads and appends
                                 through the heads-first cache); attn_with_kvcache_knobs_hnd_as_nhd
                                 takes the same and reads an HND cache as NHD (its memory reshaped)

The entry points count their calls in CALLS, so a test can show which one the gate used; where
the kernel runs in a worker process, ATTN_GATE_TEST_CALLS names a file each call is
also appended to (one entry point name a line), which the test reads back.
"""

from __future__ import annotations

import os
from collections import Counter

import torch


class _Calls(Counter):
    """A Counter that also appends each counted call to $ATTN_GATE_TEST_CALLS (the worker's calls)."""

    def __setitem__(self, key, value):
        path = os.environ.get("ATTN_GATE_TEST_CALLS")
        if path and value > self.get(key, 0):
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(f"{key}\n" * (value - self.get(key, 0)))
        super().__setitem__(key, value)


CALLS: Counter = _Calls()


def _attend(q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0, sink=None, softcap_in_backward=True):
    """q (Nq, Hq, D), k/v (Nk, Hkv, D) -> out (Nq, Hq, Dv) in q's dtype, lse (Hq, Nq) float32."""
    nq, hq, _ = q.shape
    nk, hkv, _ = k.shape
    qf = q.float().transpose(0, 1)
    kf = k.float().transpose(0, 1).repeat_interleave(hq // hkv, dim=0)
    vf = v.float().transpose(0, 1).repeat_interleave(hq // hkv, dim=0)
    s = (qf @ kf.transpose(-1, -2)) * scale
    if softcap:
        capped = torch.tanh(s / softcap) * softcap
        s = capped if softcap_in_backward else s + (capped - s).detach()  # the latter: capped values, uncapped grads
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    diag = torch.arange(nq, device=q.device).view(-1, 1) + nk - nq
    cols = torch.arange(nk, device=q.device).view(1, -1)
    allowed = torch.ones(nq, nk, dtype=torch.bool, device=q.device)
    if right >= 0:
        allowed &= cols <= diag + right
    if left >= 0:
        allowed &= cols >= diag - left
    s = s.masked_fill(~allowed, float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.float().view(hq, 1, 1).expand(hq, nq, 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse).unsqueeze(-1))
    if sink is not None:
        p = p[..., :-1]
    out = (p @ vf).transpose(0, 1).to(q.dtype)
    return out, lse


def attn_func(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    learnable_sink=None,
    return_attn_probs=False,
):
    CALLS["dense"] += 1
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    outs, lses = zip(
        *(_attend(q[b], k[b], v[b], scale, causal, window_size, softcap, learnable_sink) for b in range(q.shape[0]))
    )
    out, lse = torch.stack(outs), torch.stack(lses)
    return (out, lse) if return_attn_probs else out


def _varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_k,
    softmax_scale,
    causal,
    window_size,
    softcap,
    sink,
    return_attn_probs,
    overread=False,
    bug=None,
    seqused_k=None,
):
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    if bug == "softcap_ignored":
        softcap = 0.0
    outs, lses = [], []
    for i in range(len(cq) - 1):
        if cq[i + 1] == cq[i]:
            continue
        k_start, k_end = ck[i], (min(ck[i] + max_seqlen_k, k.shape[0]) if overread else ck[i + 1])
        if seqused_k is not None:  # the true key count of the sequence (what a kernel with seqused_k reads)
            k_end = max(ck[i], ck[i] + int(seqused_k[i]) - (1 if bug == "seqused_off_by_one" else 0))
        if bug == "window_unclamped" and window_size[0] >= 0:  # the band reaches back past the sequence start
            k_start = max(0, ck[i] - window_size[0])
        o, l = _attend(
            q[cq[i] : cq[i + 1]],
            k[k_start:k_end],
            v[k_start:k_end],
            scale,
            causal,
            window_size,
            softcap,
            sink,
            softcap_in_backward=bug != "softcap_backward_dropped",
        )
        outs.append(o)
        lses.append(l)
    out, lse = torch.cat(outs), torch.cat(lses, dim=-1)
    return (out, lse) if return_attn_probs else out


def attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    seqused_k=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    learnable_sink=None,
    return_attn_probs=False,
):
    CALLS["varlen"] += 1
    return _varlen(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_k,
        softmax_scale,
        causal,
        window_size,
        softcap,
        learnable_sink,
        return_attn_probs,
        seqused_k=seqused_k,
    )


def _varlen_entry(bug: str):
    def fn(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        seqused_k=None,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        learnable_sink=None,
        return_attn_probs=False,
    ):
        CALLS["varlen"] += 1
        return _varlen(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_k,
            softmax_scale,
            causal,
            window_size,
            softcap,
            learnable_sink,
            return_attn_probs,
            bug=bug,
            seqused_k=seqused_k,
        )

    fn.__name__ = f"attn_varlen_func_{bug}"
    fn.__doc__ = f"attn_varlen_func with the planted bug {bug!r} (see the module docstring)."
    return fn


attn_varlen_func_softcap_ignored = _varlen_entry("softcap_ignored")
attn_varlen_func_softcap_backward_dropped = _varlen_entry("softcap_backward_dropped")
attn_varlen_func_window_unclamped = _varlen_entry("window_unclamped")
attn_varlen_func_seqused_off_by_one = _varlen_entry("seqused_off_by_one")


def attn_varlen_func_overread(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    learnable_sink=None,
    return_attn_probs=False,
):
    CALLS["varlen"] += 1
    return _varlen(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_k,
        softmax_scale,
        causal,
        window_size,
        softcap,
        learnable_sink,
        return_attn_probs,
        overread=True,
    )


def _slot(block_table, page, b, pos, contiguous_pages):
    if block_table is None:
        return b, pos
    block = int(block_table[b, 0]) + pos // page if contiguous_pages else int(block_table[b, pos // page])
    return block, pos % page


def _kvcache(
    q,
    k_cache,
    v_cache,
    k,
    v,
    cache_seqlens,
    block_table,
    softmax_scale,
    causal,
    window_size,
    softcap,
    sink,
    return_softmax_lse,
    contiguous_pages=False,
    append=True,
):
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    page = k_cache.shape[1] if block_table is not None else 0
    outs, lses = [], []
    for b, cached in enumerate(cache_seqlens.tolist()):
        new = 0 if k is None else k.shape[1]
        if new and append:
            for i in range(new):
                blk, off = _slot(block_table, page, b, cached + i, contiguous_pages)
                k_cache[blk, off], v_cache[blk, off] = k[b, i], v[b, i]
        slots = [_slot(block_table, page, b, pos, contiguous_pages) for pos in range(cached)]
        kb = torch.stack([k_cache[r, c] for r, c in slots]) if slots else k_cache[0, :0]
        vb = torch.stack([v_cache[r, c] for r, c in slots]) if slots else v_cache[0, :0]
        if new:  # the appended tokens follow the cached ones
            kb, vb = torch.cat([kb, k[b]]), torch.cat([vb, v[b]])
        o, l = _attend(q[b], kb, vb, scale, causal, window_size, softcap, sink)
        outs.append(o)
        lses.append(l)
    out, lse = torch.stack(outs), torch.stack(lses)
    return (out, lse) if return_softmax_lse else out


def attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    cache_seqlens=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    learnable_sink=None,
    return_softmax_lse=False,
):
    CALLS["kvcache"] += 1
    return _kvcache(
        q,
        k_cache,
        v_cache,
        k,
        v,
        cache_seqlens,
        block_table,
        softmax_scale,
        causal,
        window_size,
        softcap,
        learnable_sink,
        return_softmax_lse,
    )


def attn_with_kvcache_no_window(
    q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None, softmax_scale=None, causal=False
):
    return attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale, causal)


def attn_with_kvcache_contiguous(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    cache_seqlens=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    learnable_sink=None,
    return_softmax_lse=False,
):
    CALLS["kvcache"] += 1
    return _kvcache(
        q,
        k_cache,
        v_cache,
        k,
        v,
        cache_seqlens,
        block_table,
        softmax_scale,
        causal,
        window_size,
        softcap,
        learnable_sink,
        return_softmax_lse,
        contiguous_pages=True,
    )


def attn_with_kvcache_no_append(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    cache_seqlens=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    learnable_sink=None,
    return_softmax_lse=False,
):
    CALLS["kvcache"] += 1
    return _kvcache(
        q,
        k_cache,
        v_cache,
        k,
        v,
        cache_seqlens,
        block_table,
        softmax_scale,
        causal,
        window_size,
        softcap,
        learnable_sink,
        return_softmax_lse,
        append=False,
    )


def attn_func_ignores_sink(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    learnable_sink=None,
    return_attn_probs=False,
):
    """Takes the sink keyword and drops it: a kernel that silently computes plain attention."""
    return attn_func(q, k, v, softmax_scale, causal, window_size, softcap, None, return_attn_probs)


KNOBS_SEEN: list[dict] = []  # the knob keywords each attn_with_kvcache_knobs* call received


def _with_knobs(q, k_cache, v_cache, k, v, cache_seqlens, block_table, knobs: dict, hnd_view, **options):
    KNOBS_SEEN.append(knobs)
    if knobs.get("kv_layout", "NHD") == "HND":
        k_cache, v_cache = hnd_view(k_cache), hnd_view(v_cache)
    return _kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, **options)


def attn_with_kvcache_knobs(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    cache_seqlens=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    learnable_sink=None,
    return_softmax_lse=False,
    num_splits=0,
    pack_gqa=None,
    kv_layout="NHD",
):
    CALLS["kvcache"] += 1
    knobs = dict(num_splits=num_splits, pack_gqa=pack_gqa, kv_layout=kv_layout)
    return _with_knobs(
        q, k_cache, v_cache, k, v, cache_seqlens, block_table, knobs, lambda t: t.transpose(1, 2),
        softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap, sink=learnable_sink,
        return_softmax_lse=return_softmax_lse,
    )  # fmt: skip


def attn_with_kvcache_knobs_hnd_as_nhd(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    cache_seqlens=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    learnable_sink=None,
    return_softmax_lse=False,
    num_splits=0,
    pack_gqa=None,
    kv_layout="NHD",
):
    CALLS["kvcache"] += 1
    knobs = dict(num_splits=num_splits, pack_gqa=pack_gqa, kv_layout=kv_layout)
    return _with_knobs(
        q, k_cache, v_cache, k, v, cache_seqlens, block_table, knobs,
        lambda t: t.view(t.shape[0], t.shape[2], t.shape[1], t.shape[3]),
        softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap, sink=learnable_sink,
        return_softmax_lse=return_softmax_lse,
    )  # fmt: skip
