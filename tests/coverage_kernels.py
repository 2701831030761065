"""User kernels for the coverage axes: one correct, and one planted bug per axis class.

`--kernel tests.coverage_kernels:NAME` runs them (flash_attn_func convention: q, k, v are
(batch, seqlen, heads, head_dim); keywords softmax_scale, causal, window_size, softcap,
alibi_slopes, return_attn_probs, attn_bias, learnable_sink; fp8 q, k, v with q_descale, k_descale,
v_descale as FA3 takes them). All share one plain implementation (float32 arithmetic,
autograd for the backward, masks written out here, not taken from gate.attention), and each bug is
the smallest realistic change to it, silent on the cases that lack its axis:

  assumes_contiguous          reads q, k, v storage as if contiguous (B, N, H, D), ignoring the
                              strides it was given (pytorch #146377: flex, sliced K)
  dout_assumed_contiguous     the backward reads dO as if contiguous (dO's strides != out's)
  zero_stride_as_dense        a K/V stride of 0 (an `expand`ed, broadcast K/V) taken for the
                              dense stride of that dim: honours every other stride
  no_max_subtraction          softmax without the running max: exp overflows past +88 (large
                              scores) and 0/0 below -103 (every row's LSE far below -88:
                              pytorch #196678's regime)
  ignores_softcap             takes softcap and forgets it (only visible once scores reach the cap)
  v_saturates_at_16           V clamped to +-16 (a static fp8-style scale calibrated on tame data):
                              only outlier channels reach it
  dq_head_dim_tail_dropped    dQ of the channels past the last full 32-wide block left 0 (head
                              dims off the 32-grid: flash-attention PR #2896, 72/104)
  scale_from_dv               1/sqrt(head_dim_v) instead of 1/sqrt(head_dim): only dv != d shows it
  causal_top_left             causal aligned top-left (SDPA's is_causal) instead of bottom-right:
                              only seqlen_q != seqlen_k shows it (skewed shapes, varlen with
                              cu_seqlens_q != cu_seqlens_k)
  key_tile_floor              loops over nk // 64 key tiles instead of ceil: keys of a partial
                              last tile ignored (tile-edge seqlens 65, 129, 1023...)
  window_ignored_when_causal  causal=True takes the causal path and drops window_size
                              (causal + window: TransformerEngine #3528's class)
  window_minus_one_ignored    a window with an unbounded (-1) side is taken as no window at all:
                              causal spelled (-1, 0) becomes full attention
  alibi_causal_only           ALiBi bias -slope * (i - j) without the abs: right only where keys
                              sit left of the diagonal (ALiBi non-causal)
  pack_gqa_decode_wrong       decode (seqlen_q 1) with GQA packs query heads onto KV heads as
                              h % Hkv instead of h // group (pytorch #193893: GQA decode, < 8 KV heads)
  lse_bias_1e_3               everything right, the LSE 1e-3 too large
  ignores_descale             fp8 inputs converted to bf16 without their descale factors
  descale_of_first_head       every (batch, KV head) dequantized with batch 0 / head 0's descale
                              (one factor read for a per-head tensor of them)
  offsets_int32               q, k, v rows addressed with 32-bit element offsets: a row at or past
                              2**31 elements is read 2**31 earlier
  batch_offsets_int32         the batch element's offset (b x batch stride) in 32 bits, the rows
                              within it in 64: an element starting past 2**31 is read 2**31 earlier
"""

from __future__ import annotations

import torch

from gate.attention.inputs import FAR
from gate.attention.reference import fp8_mma
from gate.correctness.planted import batches_read_at_int32_offsets

TILE = 64


class _GradMask(torch.autograd.Function):
    """Identity forward; the backward zeroes the gradient of channels >= `keep` (last dim)."""

    @staticmethod
    def forward(ctx, x, keep):
        ctx.keep = keep
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        grad[..., ctx.keep :] = 0
        return grad, None


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _as_contiguous_storage(t: torch.Tensor) -> torch.Tensor:
    """What a kernel that takes a data pointer and assumes contiguity reads: t's storage from its
    offset, with contiguous strides. The same tensor when t is contiguous."""
    return t.as_strided(t.shape, _contiguous_strides(t.shape), t.storage_offset())


def _zero_strides_as_dense(t: torch.Tensor) -> torch.Tensor:
    """What a kernel that takes a stride of 0 for "not given, dense" reads: every 0 stride
    replaced by the contiguous stride of its dim. The same tensor when no stride is 0."""
    if 0 not in t.stride():
        return t
    strides = tuple(d if s == 0 else s for s, d in zip(t.stride(), _contiguous_strides(t.shape)))
    return t.as_strided(t.shape, strides, t.storage_offset())


class _ContiguousDout(torch.autograd.Function):
    """Identity forward; the backward reads the incoming dO as if it were contiguous."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _as_contiguous_storage(grad)


def _attn(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, bugs=(), attn_bias=None, sink=None):
    b, nq, hq, d = q.shape
    nk, hkv = k.shape[1], k.shape[2]
    if "assumes_contiguous" in bugs:
        q, k, v = (_as_contiguous_storage(t) for t in (q, k, v))
    if "zero_stride_as_dense" in bugs:
        k, v = _zero_strides_as_dense(k), _zero_strides_as_dense(v)
    if "v_saturates_at_16" in bugs:
        v = v.clamp(-16, 16)
    if "dq_head_dim_tail_dropped" in bugs and d % 32:
        q = _GradMask.apply(q, d // 32 * 32)
    scale = d**-0.5 if softmax_scale is None else softmax_scale
    if "scale_from_dv" in bugs:
        scale = v.shape[-1] ** -0.5
    group = hq // hkv
    kv_head = torch.arange(hq, device=q.device) // group
    if "pack_gqa_decode_wrong" in bugs and nq == 1 and group > 1:
        kv_head = torch.arange(hq, device=q.device) % hkv
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2)[:, kv_head]
    vf = v.float().transpose(1, 2)[:, kv_head]
    s = (fp8_mma(qf, kf.transpose(-1, -2)) if "fp22_scores" in bugs else qf @ kf.transpose(-1, -2)) * scale
    if softcap and "ignores_softcap" not in bugs:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(nq, device=q.device).view(-1, 1) + (0 if "causal_top_left" in bugs else nk - nq)
    j = torch.arange(nk, device=q.device).view(1, -1)
    if alibi_slopes is not None:
        dist = (i - j) if "alibi_causal_only" in bugs else (i - j).abs()
        s = s - alibi_slopes.float().view(1, -1, 1, 1) * dist
    if attn_bias is not None:  # additive, broadcastable to (B, H, Nq, Nk); a boolean mask arrives as 0/-inf
        bias = attn_bias.float()
        masked = torch.isneginf(bias)  # masked_fill, not + -inf: no gradient through a fully masked row's 0/0
        s = (s + bias.masked_fill(masked, 0.0)).masked_fill(masked, float("-inf"))
    left, right = window_size
    if "window_minus_one_ignored" in bugs and -1 in (left, right):
        left, right = -1, -1
    if causal:
        if "window_ignored_when_causal" in bugs:
            left, right = -1, 0
        right = 0 if right < 0 else min(right, 0)
    allowed = torch.ones(nq, nk, dtype=torch.bool, device=q.device)
    if right >= 0:
        allowed &= j <= i + right
    if left >= 0:
        allowed &= j >= i - left
    if "key_tile_floor" in bugs:
        allowed &= j < (nk // TILE) * TILE
    s = s.masked_fill(~allowed, float("-inf"))
    sink = None if sink is None else sink.float().view(1, -1, 1, 1)  # one logit per query head, in every denominator
    if "no_max_subtraction" in bugs:
        e = torch.exp(s)
        denom = e.sum(dim=-1, keepdim=True) + (0 if sink is None else torch.exp(sink))
        p = e / denom
        lse = torch.log(denom).squeeze(-1).detach()
    else:
        m = s.amax(dim=-1, keepdim=True).detach()
        if sink is not None:
            m = torch.maximum(m, sink.detach())
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.exp(s - m)
        denom = e.sum(dim=-1, keepdim=True) + (0 if sink is None else torch.exp(sink - m))
        p = e / denom.clamp_min(torch.finfo(torch.float32).tiny)  # a fully masked row: p = 0
        lse = (m + torch.log(denom)).squeeze(-1).detach()
    out = (p @ vf).transpose(1, 2).to(q.dtype)
    if "dout_assumed_contiguous" in bugs:
        out = _ContiguousDout.apply(out)
    if "lse_bias_1e_3" in bugs:
        lse = lse + 1e-3
    return out, lse


FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _int32_rows(t):
    """`t` read as a kernel that computes row offsets in 32 bits reads it: a row starting at or
    past 2**31 elements is read 2**31 elements earlier (another row, or unwritten buffer)."""
    if t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape[:2], t.stride()[:2])) < FAR:
        return t
    base, rows = t.detach(), []
    for i in range(t.shape[0]):
        for j in range(t.shape[1]):
            offset = t.storage_offset() + i * t.stride(0) + j * t.stride(1)
            rows.append(torch.as_strided(base, t.shape[2:], t.stride()[2:], offset % FAR))
    # the values read, with t's gradient passed straight through (no backward over the whole buffer)
    return t + (torch.stack(rows).view(t.shape) - base)


def _dequantize(t, descale, bug):
    """fp8 (B, N, H, D) times its (B, Hkv) descale (query heads take their KV head's), in bf16:
    exact, so the rest of the kernel runs as for a bf16 input and returns bf16."""
    if "ignores_descale" in bug:
        return t.to(torch.bfloat16)
    if "descale_of_first_head" in bug:
        descale = descale[:1, :1].expand_as(descale)
    b, n, h, d = t.shape
    hkv = descale.shape[1]
    values = t.float().reshape(b, n, hkv, h // hkv, d) * descale.view(b, 1, hkv, 1, 1)
    return values.reshape(b, n, h, d).to(torch.bfloat16)


def _kernel(bug: str | None):
    def fn(
        q,
        k,
        v,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        alibi_slopes=None,
        return_attn_probs=False,
        q_descale=None,
        k_descale=None,
        v_descale=None,
        attn_bias=None,
        learnable_sink=None,
    ):
        if q.dtype in FP8:
            q, k, v = (_dequantize(t, s, (bug,)) for t, s in ((q, q_descale), (k, k_descale), (v, v_descale)))
        if bug == "offsets_int32":
            q, k, v = (_int32_rows(t) for t in (q, k, v))
        if bug == "batch_offsets_int32":
            q, k, v = (batches_read_at_int32_offsets(t) for t in (q, k, v))
        bugs = (bug,) if bug else ()
        out, lse = _attn(
            q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, bugs, attn_bias, learnable_sink
        )
        return (out, lse, None) if return_attn_probs else out

    fn.__name__ = bug or "correct"
    fn.__doc__ = (
        f"The shared implementation with the planted bug {bug!r} (see the module docstring)."
        if bug
        else "The unbroken implementation: every coverage case must pass it."
    )
    return fn


BUGS = (
    "assumes_contiguous",
    "dout_assumed_contiguous",
    "zero_stride_as_dense",
    "no_max_subtraction",
    "ignores_softcap",
    "v_saturates_at_16",
    "dq_head_dim_tail_dropped",
    "scale_from_dv",
    "causal_top_left",
    "key_tile_floor",
    "window_ignored_when_causal",
    "window_minus_one_ignored",
    "alibi_causal_only",
    "pack_gqa_decode_wrong",
    "lse_bias_1e_3",
    "ignores_descale",
    "descale_of_first_head",
    "offsets_int32",
    "batch_offsets_int32",
)
correct = _kernel(None)
assumes_contiguous = _kernel("assumes_contiguous")
dout_assumed_contiguous = _kernel("dout_assumed_contiguous")
zero_stride_as_dense = _kernel("zero_stride_as_dense")
no_max_subtraction = _kernel("no_max_subtraction")
ignores_softcap = _kernel("ignores_softcap")
v_saturates_at_16 = _kernel("v_saturates_at_16")
dq_head_dim_tail_dropped = _kernel("dq_head_dim_tail_dropped")
scale_from_dv = _kernel("scale_from_dv")
causal_top_left = _kernel("causal_top_left")
key_tile_floor = _kernel("key_tile_floor")
window_ignored_when_causal = _kernel("window_ignored_when_causal")
window_minus_one_ignored = _kernel("window_minus_one_ignored")
alibi_causal_only = _kernel("alibi_causal_only")
pack_gqa_decode_wrong = _kernel("pack_gqa_decode_wrong")
lse_bias_1e_3 = _kernel("lse_bias_1e_3")
offsets_int32 = _kernel("offsets_int32")
batch_offsets_int32 = _kernel("batch_offsets_int32")
# not a bug: Q K^T added up as Hopper's fp8 tensor cores do (13 fraction bits), as FA3's fp8 forward is
fp22_scores = _kernel("fp22_scores")
ignores_descale = _kernel("ignores_descale")
descale_of_first_head = _kernel("descale_of_first_head")
