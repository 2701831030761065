"""Custom biases and boolean masks: the tensor a case hands the kernel, built once here.

The convention (what every path takes, docs/kernels.md, "Custom bias and masks"):
  * a float bias is broadcastable to (batch, heads_q, seqlen_q, seqlen_k) and is ADDED to the
    scaled (and capped) scores, before the causal/window masks; -inf is allowed;
  * a boolean mask has the same broadcastable shape and is True where a query may see a key;
  * positions are bottom-right aligned like gate.attention.masks: query row i sits at key
    position i + seqlen_k - seqlen_q (clamped into [0, seqlen_k - 1] for the patterns below).

Float biases look like learned relative-position biases: a per-(batch, head) table over 64
signed distance buckets (exact below 16, logarithmic beyond, T5-style) of standard deviation 16,
plus a per-key term of deviation 2: values of tens, not unit noise, and not Toeplitz (a bias
read transposed or shifted by one key is a different bias). The values are drawn in float32 on
the CPU from the input seed (small tables only) and expanded on the device, row chunk by row
chunk, then rounded once to the bias dtype: the reference adds exactly the tensor the kernel gets.

Boolean patterns do not depend on the seed (the mask is the case's structure; the seeds vary
q, k, v): Flex builds its block mask once per case. The random pattern is an integer hash of
(batch, head, row, key), the same on any device, so a 65,537-long case needs no CPU draw.
"""

from __future__ import annotations

import math

import torch

from gate.core.cases import BOOL_BIAS_KINDS, FLOAT_BIAS_KINDS, Case

# Elements of one row chunk while building: bounds the int64 temporaries on long sequences.
BUILD_CHUNK = 2**24
BUCKETS_PER_SIDE = 32
EXACT = 16
TABLE_STD = 16.0  # values to about +-50: a bf16 rounding of an fp32 bias moves logits by up to 0.125
KEY_STD = 2.0
BOOL_DENSITY = 0.3  # fraction of (query, key) pairs the random pattern allows (plus the diagonal)
EMPTY_ROW_EVERY = 5  # bool_empty_rows: rows i with i % 5 == 2 see nothing
SHIFT = -160.0  # shifted_rows: rows i with i % 4 == 1 get this added (exact in fp32, bf16 and fp16)
SHIFT_EVERY = 4
GROW_RISE = 128.0  # growing: added from 0 at the first key to this at the last; past exp's fp32 range (88.7)
SUNK = -60000.0  # sunk_rows: below a finite "-inf" sentinel of -5e4 by more than exp's range (exact in fp32 and fp16)
FIRST_KEY_SPIKE = 10000.0  # first_key: added to key 0 of every other row (exact in fp32 and fp16)


def _positions(rows: torch.Tensor, nq: int, nk: int) -> torch.Tensor:
    """Each query row's aligned key position, clamped into range (its 'diagonal' key)."""
    return (rows + nk - nq).clamp(0, nk - 1)


def _buckets(rel: torch.Tensor, nk: int) -> torch.Tensor:
    """Signed relative distance -> 0..63: exact below EXACT, log-spaced up to nk, sign in the top half."""
    dist = rel.abs()
    span = math.log(max(nk, 2 * EXACT) / EXACT)
    far = EXACT + (torch.log(dist.clamp_min(1).double() / EXACT) / span * (BUCKETS_PER_SIDE - EXACT)).long()
    bucket = torch.where(dist < EXACT, dist, far.clamp(max=BUCKETS_PER_SIDE - 1))
    return bucket + BUCKETS_PER_SIDE * (rel > 0).long()


def _hash(b: torch.Tensor, h: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """A deterministic integer hash of the four indices (int64 arithmetic wraps the same on CPU and GPU)."""
    x = (i * 73856093) ^ (j * 19349663) ^ (b * 83492791) ^ (h * 2654435761 + 97)
    x = (x ^ (x >> 13)) * 1274126177
    x = x ^ (x >> 16)
    return x & 0xFFFF


def _sequence_case(case: Case, nq: int, nk: int) -> Case:
    """One varlen sequence as a dense case of batch 1: its bias is built as a dense case's is."""
    return case.with_fields(batch=1, seqlen_q=nq, seqlen_k=nk, varlen=None, varlen_k=None)


def _packed_bias(case: Case, seed: int, device: str | torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A varlen case's bias: each sequence's block built as its own dense case's, with positions
    inside the sequence; the blocks differ (float: a per-sequence seed; bool: a per-sequence
    pattern), so a kernel that reads another sequence's block, or the block at the packed origin,
    reads other numbers."""
    out = torch.zeros(case.bias_shape, dtype=torch.bool if case.has_bool_bias else dtype, device=device)
    q0 = k0 = 0
    for i, (nq, nk) in enumerate(zip(case.entry.varlen, case.keys_varlen)):
        if nq and nk:
            block = make_bias(_sequence_case(case, nq, nk), seed * 7919 + i, device, dtype, pattern=i)
            out[:, :, q0 : q0 + nq, k0 : k0 + nk] = block
        q0, k0 = q0 + nq, k0 + nk
    return out


def make_bias(
    case: Case, seed: int, device: str | torch.device, dtype: torch.dtype, pattern: int = 0
) -> torch.Tensor | None:
    """The case's bias tensor (float in `dtype`, or bool), or None for bias = none.
    `dtype` is the bias dtype: the input dtype, or float32 for bias_dtype fp32. `pattern` picks
    another boolean pattern of the same shape (a varlen sequence's block: its index)."""
    if not case.has_bias:
        return None
    if case.entry.varlen is not None:
        return _packed_bias(case, seed, device, dtype)
    shape = case.bias_shape
    bb, hb, nq, nk = shape
    if case.bias.kind in FLOAT_BIAS_KINDS:
        gen = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + 29)
        table = (torch.randn(bb, hb, 2 * BUCKETS_PER_SIDE, generator=gen) * TABLE_STD).to(device)
        keyterm = (torch.randn(bb, hb, nk, generator=gen) * KEY_STD).to(device)
        out = torch.empty(shape, dtype=dtype, device=device)
        step = max(1, BUILD_CHUNK // max(1, nk))
        cols = torch.arange(nk, device=device)
        for r0 in range(0, nq, step):
            rows = torch.arange(r0, min(nq, r0 + step), device=device)
            bucket = _buckets(cols.view(1, -1) - _positions(rows, nq, nk).view(-1, 1), nk)  # (r, nk)
            vals = table[:, :, bucket] + keyterm[:, :, None, :]  # float32 (bb, hb, r, nk)
            if case.bias.kind in ("shifted_rows", "sunk_rows"):  # softmax ignores a row shift; the LSE (and exp) do not
                shift = SHIFT if case.bias.kind == "shifted_rows" else SUNK
                vals = vals + torch.where(rows % SHIFT_EVERY == 1, shift, 0.0).view(1, 1, -1, 1)
            if case.bias.kind == "first_key":  # the row's max arrives first; every later key tile is far below it
                spike = torch.where((rows % 2 == 0).view(-1, 1) & (cols == 0).view(1, -1), FIRST_KEY_SPIKE, 0.0)
                vals = vals + spike.view(1, 1, len(rows), nk)
            if case.bias.kind == "growing":  # every later key tile brings a larger max: the online softmax rescales
                rise = (cols * (GROW_RISE / max(1, nk - 1))).float().view(1, 1, 1, -1)
                vals = (keyterm[:, :, None, :] + rise).expand(bb, hb, len(rows), nk)
            out[:, :, r0 : r0 + len(rows)] = vals.to(dtype)
        return out
    assert case.bias.kind in BOOL_BIAS_KINDS
    gen = torch.Generator(device="cpu").manual_seed(nq * 7919 + nk * 104729 + bb + 1_000_003 * pattern)
    starts = None
    prefix = None
    if case.bias.kind == "document":
        starts = [_document_starts(nk, gen).to(device) for _ in range(bb)]
    if case.bias.kind == "prefix_lm":
        prefix = torch.randint(1, nk + 1, (bb,), generator=gen).to(device)
    out = torch.empty(shape, dtype=torch.bool, device=device)
    step = max(1, BUILD_CHUNK // max(1, nk * hb))
    cols = torch.arange(nk, device=device)
    for r0 in range(0, nq, step):
        rows = torch.arange(r0, min(nq, r0 + step), device=device)
        pos = _positions(rows, nq, nk)
        diag = cols.view(1, -1) == pos.view(-1, 1)  # (r, nk)
        for b in range(bb):
            if case.bias.kind in ("bool_mask", "bool_empty_rows"):
                bi = torch.tensor(b + 65_537 * pattern, device=device)
                hi = torch.arange(hb, device=device).view(-1, 1, 1)
                allowed = _hash(bi, hi, rows.view(1, -1, 1), cols.view(1, 1, -1)) < int(BOOL_DENSITY * 0x10000)
                allowed = allowed | diag
                if case.bias.kind == "bool_empty_rows":
                    allowed = allowed & (rows % EMPTY_ROW_EVERY != 2).view(1, -1, 1)
            elif case.bias.kind == "document":
                doc = torch.searchsorted(starts[b], cols, right=True)  # document id of each key
                allowed = (doc[pos].view(-1, 1) == doc.view(1, -1)).unsqueeze(0)
            else:  # prefix_lm: the prefix sees itself both ways; after it, causal
                allowed = ((cols.view(1, -1) < prefix[b]) | (cols.view(1, -1) <= pos.view(-1, 1))).unsqueeze(0)
            out[b, :, r0 : r0 + len(rows)] = allowed
    return out


def _document_starts(nk: int, gen: torch.Generator) -> torch.Tensor:
    """Start positions of documents packed into nk keys (first is 0): lengths nk/8 .. nk/2, varied."""
    starts, at = [0], 0
    lo, hi = max(1, nk // 8), max(2, nk // 2)
    while True:
        at += int(torch.randint(lo, hi + 1, (1,), generator=gen))
        if at >= nk:
            break
        starts.append(at)
    return torch.tensor(starts, dtype=torch.long)


def as_additive(bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as the additive form (0 where allowed, -inf elsewhere) in `dtype`; a float
    bias unchanged. For kernels that only take a float bias (`attn_bias`)."""
    if bias.dtype != torch.bool:
        return bias
    return torch.zeros(bias.shape, dtype=dtype, device=bias.device).masked_fill(~bias, float("-inf"))


def reduce_to_bias_shape(ds: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """dScores (B, H, r, Nk) summed over the dimensions the bias broadcasts (size 1 in `shape`)."""
    dims = tuple(d for d in (0, 1) if shape[d] == 1 and ds.shape[d] != 1)
    return ds.sum(dim=dims, keepdim=True) if dims else ds
