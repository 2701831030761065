"""User kernels in the flash_attn_func convention, one correct and several with planted bugs.

They are what `--kernel tests.buggy_kernels:NAME` runs: q, k, v are (batch, seqlen, heads,
head_dim); keywords softmax_scale, causal, window_size=(left, right), alibi_slopes,
return_attn_probs as flash-attn spells them. All share one plain implementation (float32
arithmetic, autograd for the backward, masks written out here and not taken from gate.attention.masks, so
a bug there cannot hide in both kernel and reference). Each bug is the smallest realistic change
to that implementation:

  dk_scaled_1_02          dK comes back 2% too large (a wrong constant in a backward epilogue)
  causal_off_by_one       the causal diagonal shifted by one: each query also sees the next key
  scale_one_over_d        softmax_scale 1/d instead of 1/sqrt(d) (the classic slip), ignoring the
                          scale the caller passed
  scale_padded_head_dim   1/sqrt(head_dim rounded up to 16), the dim the kernel's tiles use:
                          invisible for d = 64 and 128, 9% off for d = 40
  relative_1e_4           out and dK 1e-4 too large: what fp32 cases must catch

and kernels that break the adapter contract: one that raises, one with a wrong output shape,
one that returns NaN; and one that refuses every call (NoKernel, a SKIP).
"""

from __future__ import annotations

import torch

from gate.correctness.planted import ScaleGrad


def _plain(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None, *, right_shift=0):
    """out (B, Nq, H, Dv) in q's dtype and the LSE (B, H, Nq), flash-attn's bottom-right masks."""
    b, nq, hq, d = q.shape
    nk, hkv = k.shape[1], k.shape[2]
    scale = d**-0.5 if softmax_scale is None else softmax_scale
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    vf = v.float().transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    s = (qf @ kf.transpose(-1, -2)) * scale
    i = torch.arange(nq).view(-1, 1) + (nk - nq)  # the key position each query row is aligned with
    j = torch.arange(nk).view(1, -1)
    if alibi_slopes is not None:
        s = s - alibi_slopes.float().view(1, -1, 1, 1) * (i - j).abs()
    left, right = window_size
    if causal:
        right = 0 if right < 0 else min(right, 0)
    allowed = torch.ones(nq, nk, dtype=torch.bool)
    if right >= 0:
        allowed &= j <= i + right + right_shift
    if left >= 0:
        allowed &= j >= i - left
    s = s.masked_fill(~allowed, float("-inf"))
    m = s.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    denom = e.sum(dim=-1, keepdim=True)
    p = e / denom.clamp_min(torch.finfo(torch.float32).tiny)  # a fully masked row: e = 0, so p = 0
    out = (p @ vf).transpose(1, 2).to(q.dtype)
    lse = (m + torch.log(denom)).squeeze(-1).detach()  # -inf on a fully masked row
    return out, lse


def _result(out, lse, return_attn_probs):
    return (out, lse, None) if return_attn_probs else out


def correct(
    q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None, return_attn_probs=False
):
    """The unbroken implementation: the rule must pass it."""
    return _result(*_plain(q, k, v, softmax_scale, causal, window_size, alibi_slopes), return_attn_probs)


def correct_out_only(q, k, v, softmax_scale=None, causal=False):
    """Correct, but takes no window/ALiBi keyword: cases that need them are SKIPPED."""
    return _plain(q, k, v, softmax_scale, causal)[0]


# identity forward, the gradient flowing back scaled: the selftest's own wrapper


def dk_scaled_1_02(
    q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None, return_attn_probs=False
):
    """Forward exact; dK multiplied by 1.02."""
    k = ScaleGrad.apply(k, 1.02)
    return _result(*_plain(q, k, v, softmax_scale, causal, window_size, alibi_slopes), return_attn_probs)


def relative_1e_4(
    q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None, return_attn_probs=False
):
    """out and dK both 1e-4 too large (relative): invisible in bf16, a clear failure in fp32."""
    k = ScaleGrad.apply(k, 1.0 + 1e-4)
    out, lse = _plain(q, k, v, softmax_scale, causal, window_size, alibi_slopes)
    return _result(out * (1.0 + 1e-4), lse, return_attn_probs)


def causal_off_by_one(
    q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None, return_attn_probs=False
):
    """The right edge of the mask (causal or window) one key too far: `<= diag + 1`."""
    out_lse = _plain(q, k, v, softmax_scale, causal, window_size, alibi_slopes, right_shift=1)
    return _result(*out_lse, return_attn_probs)


def scale_one_over_d(
    q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None, return_attn_probs=False
):
    """Ignores softmax_scale and uses 1/d."""
    scale = 1.0 / q.shape[-1]
    return _result(*_plain(q, k, v, scale, causal, window_size, alibi_slopes), return_attn_probs)


def scale_padded_head_dim(
    q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None, return_attn_probs=False
):
    """1/sqrt of the head dim padded to a multiple of 16 (as the kernel's tiles see it): right for
    d = 64 or 128, 9% too small for d = 40 (padded to 48)."""
    d = q.shape[-1]
    scale = (-(-d // 16) * 16) ** -0.5
    return _result(*_plain(q, k, v, scale, causal, window_size, alibi_slopes), return_attn_probs)


def raises(q, k, v, softmax_scale=None, causal=False):
    raise RuntimeError("planted crash: kernel launch failed\nsecond line of the message")


def refuses(q, k, v, softmax_scale=None, causal=False):
    from gate.kernels.base import NoKernel

    raise NoKernel("planted refusal: no kernel for this case")


def wrong_shape(q, k, v, softmax_scale=None, causal=False):
    """Returns (B, H, N, D) instead of (B, N, H, D): the transposition everyone forgets once."""
    return _plain(q, k, v, softmax_scale, causal)[0].transpose(1, 2)


def returns_nan(q, k, v, softmax_scale=None, causal=False):
    out = _plain(q, k, v, softmax_scale, causal)[0]
    return out * torch.where(torch.arange(out.shape[1]).view(1, -1, 1, 1) == out.shape[1] - 1, float("nan"), 1.0).to(
        out.dtype
    )


_DRIFT_CALLS = [0]


def drifting(
    q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None, return_attn_probs=False
):
    """Correct on its first call, dK x1.02 on every later one: a kernel whose second run disagrees
    with its first (what the selftest's control must refuse to call a pass)."""
    _DRIFT_CALLS[0] += 1
    if _DRIFT_CALLS[0] > 1:
        k = ScaleGrad.apply(k, 1.02)
    return _result(*_plain(q, k, v, softmax_scale, causal, window_size, alibi_slopes), return_attn_probs)
