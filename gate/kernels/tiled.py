"""`tiled`: the FlashAttention algorithm in plain PyTorch, written to be read.

Forward (per query tile, streaming over key tiles):
    S = scale * Q K^T        (then softcap, ALiBi, mask)
    m_new = max(m, rowmax S);  alpha = exp(m - m_new)
    l = alpha * l + rowsum(exp(S - m_new));  acc = alpha * acc + exp(S - m_new) V
    O = acc / l;  LSE = m + log(l)          (only O and LSE are kept: O(N) memory)
Backward recomputes P = exp(S - LSE) tile by tile instead of storing it:
    D = rowsum(dO * O)
    dV += P^T dO;  dP = dO V^T;  dS = P * (dP - D);  dQ += scale * dS K;  dK += scale * dS^T Q
Arithmetic is float32 (as a GPU kernel accumulates); inputs and outputs keep their dtype.
Dropout draws its keep-mask from the call's seed and reuses it in the backward.

Sinks: the running max starts at the head's sink logit and the running sum at 1
(exp(sink - sink)), so the sink sits in every denominator; dsink = -sum_rows exp(sink - LSE) * D.
Decode: `decode` implements the KV cache itself: it appends the new k/v by walking the block table
(logical page pos // page -> physical block, offset pos % page), then streams the cached keys tile
by tile through the same page walk, so the whole paged path runs (and is tested) on a CPU.
A decode case's knobs take its other paths: num_splits >= 2 (runs of key tiles attended apart,
combined by their LSE), pack_gqa (a KV head's query heads packed into rows), kv_layout HND.
A custom bias is added to each tile's scores after the softcap (a boolean one masks);
its gradient is dS (before the softcap factor) summed over the bias's broadcast dims.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from gate.attention.bias import reduce_to_bias_shape
from gate.attention.inputs import dequantize
from gate.attention.kvcache import as_nhd
from gate.attention.masks import alibi_bias, allowed_mask
from gate.attention.reference import AttnOptions
from gate.core.cases import first_visible_key
from gate.kernels.base import (
    Capabilities,
    KernelAdapter,
    KernelCall,
    KernelOutput,
    entry_kind,
    per_sequence,
    per_sequence_seeded,
    read_pages,
    write_pages,
)
from gate.kernels.capabilities import feature_set

TILE = 64


class TileSteps:
    """The steps of the tile loop a kernel could get wrong, one method each. `tiled` uses these;
    the selftest's planted bugs (gate/correctness/planted.py) subclass it and override one step, so
    a planted bug differs from `tiled` in exactly that step and nowhere else."""

    def scores(self, qt, kt, rows, cols, nq, nk, opts: AttnOptions, bias=None):
        """Masked, capped, biased scores for one tile, and tanh (for softcap's backward) or None."""
        s, tanh = self.scaled_capped(qt @ kt.transpose(-1, -2), opts)
        if opts.alibi_slopes is not None:
            s = s + self.alibi(opts.alibi_slopes, rows, nq, nk)[:, :, cols]
        if bias is not None:
            tile = bias[:, :, rows][:, :, :, cols]
            s = s.masked_fill(~tile, float("-inf")) if tile.dtype == torch.bool else s + tile.float()
        allowed = allowed_mask(rows, nq, nk, *self.mask(opts.causal, opts.window))
        if allowed is not None:
            s = s.masked_fill(~allowed[:, cols], float("-inf"))
        return s, tanh

    def scaled_capped(self, qk, opts: AttnOptions):
        """(Q K^T * scale, softcapped: cap * tanh(. / cap)), and tanh or None."""
        s = qk * opts.softmax_scale
        if not opts.softcap:
            return s, None
        tanh = torch.tanh(s / opts.softcap)
        return tanh * opts.softcap, tanh

    def alibi(self, slopes, rows, nq, nk):
        """The ALiBi bias added to the rows' scores."""
        return alibi_bias(slopes, rows, nq, nk)

    def mask(self, causal: bool, window):
        """The (causal, window) the tile is masked with."""
        return causal, window

    def backward_keep(self, keep):
        """The dropout mask the backward uses: the forward's."""
        return keep

    def expand_kv(self, t, group: int):
        """(b, hkv, n, d) -> (b, hq, n, d): query head h reads kv head h // group."""
        return t.repeat_interleave(group, dim=1)

    def reduce_kv(self, t, b: int, hkv: int, group: int):
        """The inverse of expand_kv for gradients: the query heads of a group summed into their kv head."""
        n, d = t.shape[-2:]
        return t.view(b, hkv, group, n, d).sum(dim=2)

    def key_end(self, nk: int) -> int:
        """Where the key loop stops."""
        return nk

    def key_start(self, first: int) -> int:
        """Where a decode step's key loop starts: the tile holding `first`, the first key any query
        sees (tiles wholly before the window are skipped, as a GPU kernel's first key block is)."""
        return first - first % TILE

    def key_tiles(self, nk: int):
        """The forward's key tile starts, in the order it walks them: first to last."""
        return range(0, self.key_end(nk), TILE)

    def rescale(self, m, s):
        """(new running max, the max subtracted in exp, alpha = exp(old max - subtracted))."""
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        return m_new, m_safe, torch.exp(m - m_safe)

    def delta(self, do, out):
        """D = rowsum(dO * O)."""
        return (do * out.float().transpose(1, 2)).sum(dim=-1, keepdim=True)

    def softcap_grad(self, ds, tanh):
        """dS through the softcap: times d(cap * tanh(s / cap))/ds = 1 - tanh^2."""
        return ds * (1 - tanh * tanh)

    def cache_view(self, cache, kv_layout: str):
        """A decode cache tensor as (B or blocks, slots, Hkv, D): an HND one read through its strides."""
        return as_nhd(cache, kv_layout)

    def combine(self, parts, sink):
        """Split-KV: the splits' (out, lse), each over its own keys, as one (out, lse): every split
        weighted by exp(its LSE - the total LSE); a sink (per row) joins the total once."""
        lses = torch.stack([lse for _, lse in parts])  # (splits, 1, heads, rows)
        if sink is not None:
            lses = torch.cat([lses, sink.squeeze(-1)[None]])
        lse = torch.logsumexp(lses, dim=0)
        lse_safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
        out = sum(torch.exp(part_lse - lse_safe).unsqueeze(-1) * part_out for part_out, part_lse in parts)
        return out, lse

    def write_rows(self, out, lse, b: int, out_b, lse_b):
        """Batch element b's rows, (1, hq, nq, dv) and (1, hq, nq), written into the call's outputs."""
        out[b] = out_b[0]
        lse[b] = lse_b[0]


STEPS = TileSteps()


class _TiledAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, opts: AttnOptions, keep, sink=None, bias=None, steps: TileSteps = STEPS):
        b, nq, hq, d = q.shape
        nk, hkv = k.shape[1], k.shape[2]
        group = hq // hkv
        qf = q.float().transpose(1, 2)
        kf = steps.expand_kv(k.float().transpose(1, 2), group)
        vf = steps.expand_kv(v.float().transpose(1, 2), group)
        rescale = 1.0 / (1.0 - opts.dropout_p) if opts.dropout_p else 1.0
        out = torch.zeros(b, hq, nq, v.shape[-1], dtype=torch.float32, device=q.device)
        lse = torch.empty(b, hq, nq, dtype=torch.float32, device=q.device)
        for r0 in range(0, nq, TILE):
            rows = torch.arange(r0, min(nq, r0 + TILE), device=q.device)
            m, l = _softmax_start((b, hq, len(rows), 1), None if sink is None else sink.view(1, hq, 1, 1), q.device)
            acc = torch.zeros(b, hq, len(rows), v.shape[-1], device=q.device)
            for c0 in steps.key_tiles(nk):
                cols = slice(c0, min(nk, c0 + TILE))
                s, _ = steps.scores(qf[:, :, rows], kf[:, :, cols], rows, cols, nq, nk, opts, bias)
                m_new, m_safe, alpha = steps.rescale(m, s)
                p = torch.exp(s - m_safe)
                l = alpha * l + p.sum(dim=-1, keepdim=True)
                if keep is not None:
                    p = p * keep[:, :, rows][:, :, :, cols] * rescale
                acc = alpha * acc + p @ vf[:, :, cols]
                m = m_new
            out[:, :, rows], lse[:, :, rows] = _softmax_finish(acc, m, l)
        out_t = out.transpose(1, 2).to(q.dtype)
        keep = steps.backward_keep(keep)
        ctx.save_for_backward(
            q,
            k,
            v,
            out_t,
            lse,
            keep if keep is not None else torch.empty(0),
            sink if sink is not None else torch.empty(0),
            bias if bias is not None else torch.empty(0),
        )
        ctx.opts, ctx.steps = opts, steps
        ctx.has_keep = keep is not None
        ctx.has_sink = sink is not None
        ctx.has_bias = bias is not None
        ctx.mark_non_differentiable(lse)
        return out_t, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, keep, sink, bias = ctx.saved_tensors
        keep = keep if ctx.has_keep else None
        bias = bias if ctx.has_bias else None
        dbias = None
        if bias is not None and bias.dtype != torch.bool and ctx.needs_input_grad[6]:
            dbias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
        opts: AttnOptions = ctx.opts
        steps: TileSteps = ctx.steps
        b, nq, hq, d = q.shape
        nk, hkv = k.shape[1], k.shape[2]
        group = hq // hkv
        qf = q.float().transpose(1, 2)
        kf = steps.expand_kv(k.float().transpose(1, 2), group)
        vf = steps.expand_kv(v.float().transpose(1, 2), group)
        do = dout.float().transpose(1, 2)
        delta = steps.delta(do, out)
        # A fully masked row has LSE -inf; +inf there makes exp(S - LSE) = 0 instead of NaN.
        lse_bwd = torch.where(torch.isinf(lse), torch.full_like(lse, float("inf")), lse).unsqueeze(-1)
        rescale = 1.0 / (1.0 - opts.dropout_p) if opts.dropout_p else 1.0
        dq = torch.zeros_like(qf)
        dk = torch.zeros_like(kf)
        dv = torch.zeros_like(vf)
        for r0 in range(0, nq, TILE):
            rows = torch.arange(r0, min(nq, r0 + TILE), device=q.device)
            for c0 in range(0, steps.key_end(nk), TILE):
                cols = slice(c0, min(nk, c0 + TILE))
                s, tanh = steps.scores(qf[:, :, rows], kf[:, :, cols], rows, cols, nq, nk, opts, bias)
                p = torch.exp(s - lse_bwd[:, :, rows])
                dp = do[:, :, rows] @ vf[:, :, cols].transpose(-1, -2)
                pz = p
                if keep is not None:
                    z = keep[:, :, rows][:, :, :, cols] * rescale
                    pz, dp = p * z, dp * z
                dv[:, :, cols] += pz.transpose(-1, -2) @ do[:, :, rows]
                ds = p * (dp - delta[:, :, rows])
                if dbias is not None:
                    dbias[:, :, r0 : r0 + len(rows), cols] += reduce_to_bias_shape(ds, tuple(bias.shape))
                if tanh is not None:
                    ds = steps.softcap_grad(ds, tanh)
                dq[:, :, rows] += (ds @ kf[:, :, cols]) * opts.softmax_scale
                dk[:, :, cols] += (ds.transpose(-1, -2) @ qf[:, :, rows]) * opts.softmax_scale
        dk = steps.reduce_kv(dk, b, hkv, group)
        dv = steps.reduce_kv(dv, b, hkv, group)
        dsink = None
        if ctx.has_sink:  # the sink's share of each row, times -D (see the module doc)
            p_sink = torch.exp(sink.float().view(1, hq, 1) - lse)
            dsink = -(p_sink * delta.squeeze(-1)).sum(dim=(0, 2)).to(sink.dtype)
        return (
            dq.transpose(1, 2).to(q.dtype),
            dk.transpose(1, 2).to(k.dtype),
            dv.transpose(1, 2).to(v.dtype),
            None,
            None,
            dsink,
            None if dbias is None else dbias.to(bias.dtype),
            None,
        )


def tiled_attention(q, k, v, opts: AttnOptions, keep=None, sink=None, bias=None, steps: TileSteps = STEPS):
    """(out, lse) of the tile loop, differentiable in q, k, v, sink and a float bias."""
    return _TiledAttention.apply(q, k, v, opts, keep, sink, bias, steps)


def _softmax_start(shape: tuple[int, ...], sink, device):
    """(running max, running sum) of rows `shape` (b, heads, rows, 1) before the first key tile: -inf
    and 0, or each row's sink logit (`sink` broadcast to `shape`) and 1."""
    if sink is None:
        m = torch.full(shape, float("-inf"), device=device)
        return m, torch.zeros_like(m)
    m = sink.float().expand(shape).clone()
    return m, torch.ones_like(m)


def _softmax_finish(acc, m, l):
    """(out, lse) of rows whose every key tile is in: acc / l, and out 0 with LSE -inf where no key
    was allowed."""
    empty = l == 0
    out = torch.where(empty, torch.zeros_like(acc), acc / torch.where(empty, torch.ones_like(l), l))
    return out, torch.where(empty, torch.full_like(l, float("-inf")), m + torch.log(l)).squeeze(-1)


@dataclass(frozen=True)
class DecodeRows:
    """How a decode step lays its query rows out: one row per query token in each query head, or
    (pack_gqa) the `group` query heads of one KV head packed into its rows, row r = token r // group
    of head kv * group + r % group, so a tile of rows reads each K/V tile once for the whole group."""

    nq: int
    hq: int
    hkv: int
    packed: bool

    @property
    def group(self) -> int:
        return self.hq // self.hkv

    def positions(self, device) -> torch.Tensor:
        """The query token of each row (what the causal mask and the window read)."""
        rows = torch.arange(self.nq, device=device)
        return rows.repeat_interleave(self.group) if self.packed else rows

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """(1, hq, nq, ...) -> (1, heads, rows, ...)."""
        if not self.packed:
            return t
        rest = t.shape[3:]
        return t.reshape(1, self.hkv, self.group, self.nq, *rest).transpose(2, 3).reshape(1, self.hkv, -1, *rest)

    def unpack(self, t: torch.Tensor) -> torch.Tensor:
        """(1, heads, rows, ...) -> (1, hq, nq, ...)."""
        if not self.packed:
            return t
        rest = t.shape[3:]
        return t.reshape(1, self.hkv, self.nq, self.group, *rest).transpose(2, 3).reshape(1, self.hq, self.nq, *rest)

    def per_row(self, per_head: torch.Tensor) -> torch.Tensor:
        """A per-query-head value (hq,) as (1, heads, rows, 1)."""
        return self.pack(per_head.float().view(1, self.hq, 1, 1).expand(1, self.hq, self.nq, 1))


def split_spans(first: int, nk: int, num_splits: int) -> list[tuple[int, int]]:
    """The key ranges of a split-KV step: the key tiles from `first` on, dealt into `num_splits`
    runs of consecutive tiles as evenly as they go (a split with no tile is empty, as a GPU
    kernel's surplus splits are). One split: the whole range."""
    if num_splits <= 1:
        return [(first, nk)]
    tiles = list(range(first, nk, TILE)) or [nk]  # no key: every split empty
    bounds = [tiles[i * len(tiles) // num_splits] for i in range(num_splits)]
    return list(zip(bounds, bounds[1:] + [nk]))


def decode(call: KernelCall, steps: TileSteps = STEPS) -> KernelOutput:
    """A decode step on call.cache: append (if any), then each batch element's queries against its
    own cached keys, streamed tile by tile from the pages, from the tile of the first key a query
    sees. Forward only. The case's knobs choose the path: num_splits >= 2 attends each run of key
    tiles apart and combines the partial results by their LSE; pack_gqa packs the query heads of a
    KV head into rows (DecodeRows); kv_layout HND reads and appends through the heads-first cache."""
    c, opts = call.cache, call.opts
    q = call.q
    bsz, nq, hq, _ = q.shape
    k_cache, v_cache = (steps.cache_view(t, c.kv_layout) for t in (c.k_cache, c.v_cache))
    layout = DecodeRows(nq, hq, k_cache.shape[-2], bool(call.knobs.pack_gqa))
    out = torch.zeros(bsz, hq, nq, v_cache.shape[-1], dtype=torch.float32, device=q.device)
    lse = torch.zeros(bsz, hq, nq, dtype=torch.float32, device=q.device)
    sink = None if call.sink is None else layout.per_row(call.sink)
    split = call.knobs.num_splits >= 2
    for b, cached in enumerate(c.cached):
        if c.k_new is not None:
            write_pages(k_cache, c.block_table, c.page_size, b, cached, c.k_new[b])
            write_pages(v_cache, c.block_table, c.page_size, b, cached, c.v_new[b])
        nk = cached + (0 if c.k_new is None else c.k_new.shape[1])
        qf = layout.pack(q[b : b + 1].float().transpose(1, 2))
        first = steps.key_start(first_visible_key(nq, nk, opts.window))
        if not split:
            o_b, l_b = _attend_keys(qf, k_cache, v_cache, call, b, (first, nk), nk, layout, sink, steps)
        else:  # each split from an empty softmax: the sink joins once, in the combine
            parts = [
                _attend_keys(qf, k_cache, v_cache, call, b, span, nk, layout, None, steps)
                for span in split_spans(first, nk, call.knobs.num_splits)
            ]
            o_b, l_b = steps.combine(parts, sink)
        steps.write_rows(out, lse, b, layout.unpack(o_b), layout.unpack(l_b.unsqueeze(-1)).squeeze(-1))
    return KernelOutput(out=out.transpose(1, 2).to(q.dtype), lse=lse)


def _attend_keys(qf, k_cache, v_cache, call: KernelCall, b: int, span, nk: int, layout: DecodeRows, sink, steps):
    """(out, lse) of rows `qf` (1, heads, rows, d) against keys span[0]..span[1]-1 of batch element b,
    tile by tile from the pages: out normalised (0 where no key is allowed, LSE -inf there)."""
    c, opts = call.cache, call.opts
    heads, nrows = qf.shape[1], qf.shape[2]
    rows = layout.positions(qf.device)
    score_opts = opts
    if layout.packed and opts.alibi_slopes is not None:  # per row, added below: the heads are KV heads
        score_opts = dataclasses.replace(opts, alibi_slopes=None)
    m, l = _softmax_start((1, heads, nrows, 1), sink, qf.device)
    acc = torch.zeros(1, heads, nrows, v_cache.shape[-1], device=qf.device)
    for c0 in range(span[0], span[1], TILE):
        cols = slice(c0, min(span[1], c0 + TILE))
        kt = read_pages(k_cache, c.block_table, c.page_size, b, cols.start, cols.stop)
        vt = read_pages(v_cache, c.block_table, c.page_size, b, cols.start, cols.stop)
        group = 1 if layout.packed else layout.group
        kf = kt.float().transpose(0, 1).repeat_interleave(group, dim=0)[None]
        vf = vt.float().transpose(0, 1).repeat_interleave(group, dim=0)[None]
        s, _ = steps.scores(qf, kf, rows, cols, layout.nq, nk, score_opts)
        if score_opts is not opts:
            s = s + _packed_alibi(steps, opts.alibi_slopes, layout, rows, cols, nk)
        m_new, m_safe, alpha = steps.rescale(m, s)
        p = torch.exp(s - m_safe)
        l = alpha * l + p.sum(dim=-1, keepdim=True)
        acc = alpha * acc + p @ vf
        m = m_new
    return _softmax_finish(acc, m, l)


def _packed_alibi(steps: TileSteps, slopes, layout: DecodeRows, rows, cols: slice, nk: int) -> torch.Tensor:
    """The ALiBi bias of packed rows: row r of KV head g takes the slope of query head g * group + r % group."""
    full = steps.alibi(slopes, rows, layout.nq, nk)[:, :, cols]  # (hq, rows, keys)
    r = torch.arange(rows.numel(), device=rows.device)
    head = torch.arange(layout.hkv, device=rows.device).view(-1, 1) * layout.group + r % layout.group
    return full[head, r][None]


def dropout_keep_mask(shape, p: float, seed: int, device) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed + 7919)
    return (torch.rand(shape, generator=gen) >= p).to(device)


class TiledAdapter(KernelAdapter):
    name = "tiled"
    description = "attn-gate's own FlashAttention algorithm in plain PyTorch (float32 tiles)"

    def capabilities(self) -> Capabilities:
        return Capabilities(
            devices=("cpu", "cuda"),
            dtypes=("fp16", "bf16", "fp32", "e4m3", "e5m2"),
            max_head_dim=512,
            features=feature_set(
                head_dim_v_differs=True,
                window=True,
                softcap=True,
                alibi=True,
                dropout=True,
                varlen=True,
                kvcache=True,
                paged=True,
                sinks=True,
                bias=True,
                bias_grad=True,
                bool_mask=True,
                varlen_bias=True,
                num_splits=True,
                pack_gqa=True,
                hnd_cache=True,
            ),
            deterministic_mode=True,
            returns_lse=True,
        )

    def tile_steps(self, call: KernelCall, keep) -> TileSteps:
        """The tile loop's steps for this call: tiled's own (the selftest's variants plant theirs)."""
        return STEPS

    def _dense(self, q, k, v, call: KernelCall, keep=None) -> KernelOutput:
        out, lse = tiled_attention(q, k, v, call.opts, keep, call.sink, call.opts.bias, self.tile_steps(call, keep))
        return KernelOutput(out=out, lse=lse, dropout_keep=keep)

    def __call__(self, call: KernelCall) -> KernelOutput:
        kind = entry_kind(call)
        if kind == "kvcache":
            return decode(call, self.tile_steps(call, None))
        if call.descale is not None:  # fp8 (dense, forward-only): its bf16 path on the dequantized values
            q, k, v = (dequantize(t, s).to(torch.bfloat16) for t, s in zip((call.q, call.k, call.v), call.descale))
            return self._dense(q, k, v, call)
        p = call.opts.dropout_p
        if kind == "dense":
            keep = None
            if p:
                b, nq, hq, _ = call.q.shape
                keep = dropout_keep_mask((b, hq, nq, call.k.shape[1]), p, call.seed, call.q.device)
            return self._dense(call.q, call.k, call.v, call, keep)
        if not p:
            return per_sequence(call, self._dense)

        def run(q, k, v, seq_call, seed):  # each sequence its own mask
            keep = dropout_keep_mask((1, q.shape[2], q.shape[1], k.shape[1]), p, seed, q.device)
            return self._dense(q, k, v, seq_call, keep)

        return per_sequence_seeded(call, run)
