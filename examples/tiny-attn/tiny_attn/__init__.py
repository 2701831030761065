"""tiny-attn: attention in plain PyTorch with a hand-written backward, in flash-attn's calling
conventions: `flash_attn_func` (q, k, v of shape (batch, seqlen, heads, head_dim)) and
`flash_attn_varlen_func` (sequences packed as (total, heads, head_dim) with cu_seqlens).

It stands for the kernel you maintain: the forward keeps only the output and the log-sum-exp
(LSE), and the backward recomputes the probabilities from them, as FlashAttention does. Arithmetic
is float32; inputs and outputs keep their dtype. Grouped-query attention (fewer key/value heads),
causal masks and sliding windows (both aligned bottom-right, as in flash-attn) are supported.
"""

from __future__ import annotations

import math

import torch

__all__ = ["flash_attn_func", "flash_attn_varlen_func"]


def _allowed(nq: int, nk: int, causal: bool, window: tuple[int, int], device) -> torch.Tensor | None:
    """(nq, nk) bool: which keys each query sees; None when all do."""
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if left < 0 and right < 0:
        return None
    rows = torch.arange(nq, device=device).unsqueeze(-1) + (nk - nq)  # the key aligned with each query
    cols = torch.arange(nk, device=device)
    allowed = torch.ones(nq, nk, dtype=torch.bool, device=device)
    if right >= 0:
        allowed &= cols <= rows + right
    if left >= 0:
        allowed &= cols >= rows - left
    return allowed


def _scores(q, k, scale, causal, window):
    s = scale * (q @ k.transpose(-1, -2))
    allowed = _allowed(q.shape[-2], k.shape[-2], causal, window, q.device)
    return s if allowed is None else s.masked_fill(~allowed, float("-inf"))


class _Attention(torch.autograd.Function):
    """q (B, H, Nq, D), k (B, Hk, Nk, D), v (B, Hk, Nk, Dv), float32."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal, window):
        group = q.shape[1] // k.shape[1]
        kx, vx = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        s = _scores(q, kx, scale, causal, window)
        lse = torch.logsumexp(s, dim=-1, keepdim=True)  # -inf on a row that sees no key
        p = torch.exp(s - lse.nan_to_num(neginf=0.0)).nan_to_num(0.0)
        out = p @ vx
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.causal, ctx.window = scale, causal, window
        return out, lse.squeeze(-1)

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        scale, group = ctx.scale, q.shape[1] // k.shape[1]
        kx, vx = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        p = torch.exp(_scores(q, kx, scale, ctx.causal, ctx.window) - lse.nan_to_num(neginf=0.0)).nan_to_num(0.0)
        dv = p.transpose(-1, -2) @ dout
        dp = dout @ vx.transpose(-1, -2)
        ds = p * (dp - (dout * out).sum(-1, keepdim=True))
        dq = scale * ds @ kx
        dk = scale * ds.transpose(-1, -2) @ q
        b, hk = k.shape[:2]
        dk = dk.view(b, hk, group, *dk.shape[2:]).sum(2)
        dv = dv.view(b, hk, group, *dv.shape[2:]).sum(2)
        return dq, dk, dv, None, None, None


def flash_attn_func(
    q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), return_attn_probs=False
):
    """out (B, Nq, H, Dv); with return_attn_probs, (out, lse (B, H, Nq), None) as flash-attn returns."""
    if dropout_p:
        raise NotImplementedError("tiny-attn has no dropout")
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    qf, kf, vf = (t.transpose(1, 2).float() for t in (q, k, v))
    out, lse = _Attention.apply(qf, kf, vf, scale, causal, tuple(window_size))
    out = out.transpose(1, 2).to(q.dtype)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    return_attn_probs=False,
):
    """Packed sequences: q (total_q, H, D), k and v (total_k, Hk, D); lse (H, total_q). Each
    sequence is attended alone, masks aligned to its own lengths."""
    outs, lses = [], []
    for i in range(len(cu_seqlens_q) - 1):
        q0, q1 = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1])
        k0, k1 = int(cu_seqlens_k[i]), int(cu_seqlens_k[i + 1])
        out, lse, _ = flash_attn_func(
            q[None, q0:q1],
            k[None, k0:k1],
            v[None, k0:k1],
            dropout_p,
            softmax_scale,
            causal,
            window_size,
            return_attn_probs=True,
        )
        outs.append(out[0])
        lses.append(lse[0])
    out, lse = torch.cat(outs), torch.cat(lses, dim=-1)
    return (out, lse, None) if return_attn_probs else out
