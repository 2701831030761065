"""User kernels that take an `attn_bias`: one correct, three with the planted bias bugs.

`--kernel tests.bias_kernels:NAME`. The convention they follow (docs/kernels.md, "Custom bias and masks"): attn_bias
is a float tensor broadcastable to (batch, heads, seqlen_q, seqlen_k), added to the scaled scores
before the causal mask; -inf allowed; gradient flows to it. One plain float32 implementation
with autograd, masks written out here (not taken from gate.attention), and each bug the smallest
realistic change to it:

  bias_rounded_to_input_dtype  an fp32 bias cast to the input dtype before use (pytorch PR
                               #191612: cuDNN read an fp32 attn_mask as bf16)
  bias_head0                   every head reads head 0's bias (a per-head stride of 0)
  bias_no_grad                 the bias is detached: dBias never comes back
"""

from __future__ import annotations

import torch


def _plain(q, k, v, softmax_scale=None, causal=False, attn_bias=None, *, bias_fn=None):
    """out (B, Nq, H, Dv) in q's dtype and the LSE (B, H, Nq); bottom-right causal."""
    b, nq, hq, d = q.shape
    nk, hkv = k.shape[1], k.shape[2]
    scale = d**-0.5 if softmax_scale is None else softmax_scale
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    vf = v.float().transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    s = (qf @ kf.transpose(-1, -2)) * scale
    if attn_bias is not None:
        bias = attn_bias if bias_fn is None else bias_fn(attn_bias, q)
        s = s + bias.float()
    if causal:
        i = torch.arange(nq).view(-1, 1) + (nk - nq)
        s = s.masked_fill(torch.arange(nk).view(1, -1) > i, float("-inf"))
    m = s.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    denom = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(denom > 0, denom, torch.ones_like(denom))  # a fully masked row: e = 0, so p = 0 (grads too)
    out = (p @ vf).transpose(1, 2).to(q.dtype)
    lse = (m + torch.log(denom)).squeeze(-1).detach()
    return out, lse


def _result(out, lse, return_attn_probs):
    return (out, lse, None) if return_attn_probs else out


def correct(q, k, v, softmax_scale=None, causal=False, attn_bias=None, return_attn_probs=False):
    """The unbroken implementation: the rule must pass it."""
    return _result(*_plain(q, k, v, softmax_scale, causal, attn_bias), return_attn_probs)


def bias_rounded_to_input_dtype(q, k, v, softmax_scale=None, causal=False, attn_bias=None, return_attn_probs=False):
    """Casts the bias to q's dtype first: harmless for a bias already in that dtype, wrong for fp32."""
    fn = lambda bias, q: bias.to(q.dtype)  # noqa: E731
    return _result(*_plain(q, k, v, softmax_scale, causal, attn_bias, bias_fn=fn), return_attn_probs)


def bias_head0(q, k, v, softmax_scale=None, causal=False, attn_bias=None, return_attn_probs=False):
    """Head 0's bias for every head (right for a bias broadcast over heads, wrong for a per-head one)."""
    fn = lambda bias, q: bias[:, :1].expand(bias.shape)  # noqa: E731
    return _result(*_plain(q, k, v, softmax_scale, causal, attn_bias, bias_fn=fn), return_attn_probs)


def bias_no_grad(q, k, v, softmax_scale=None, causal=False, attn_bias=None, return_attn_probs=False):
    """Forward exact; the bias is detached, so it gets no gradient."""
    fn = lambda bias, q: bias.detach()  # noqa: E731
    return _result(*_plain(q, k, v, softmax_scale, causal, attn_bias, bias_fn=fn), return_attn_probs)


def correct_without_bias(q, k, v, softmax_scale=None, causal=False, return_attn_probs=False):
    """Correct, but takes no attn_bias keyword: every bias case is SKIPPED."""
    return _result(*_plain(q, k, v, softmax_scale, causal), return_attn_probs)
