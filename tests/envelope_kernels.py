"""Plain-PyTorch kernels with known envelopes, for the declared envelope and `attn-gate probe`.

Each is `attend` (float32 softmax attention in the flash_attn_func convention, GQA by repeated K/V
heads, bottom-right causal) with one limit of its own:

    attend               takes everything it has keywords for (causal, softcap, window_size)
    upto_128             raises past head dim 128
    fp16_only            raises on any dtype but fp16
    multiple_of_128      raises unless every length is a multiple of 128
    no_gqa               raises when K/V have fewer heads than Q
    wrong_on_gqa         runs GQA, but pairs each query head with the wrong KV head (silently wrong)
    hangs_on_window      sleeps forever when given a sliding window
    fp16_only_grad_off   fp16_only, but turns autograd off in its process before it raises
    causal_equal_lengths raises on a causal call whose q and k lengths differ (a tutorial's mask)
    top_left_causal      aligns its causal mask top-left (query i sees keys up to i), silently
    causal_backward      a backward written for causal attention (a tutorial's): a non-causal
                         call's output is right, its gradients are causal attention's
    causal_only          raises on any call without a causal mask (a decoder's training kernel)

With ENVELOPE_KERNEL_LOG set, each call that runs appends its process id to that file: which
worker ran it.
"""

from __future__ import annotations

import os
import time

import torch


def attend(
    q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, return_attn_probs=False, _pair=None
):
    """(B, N, H, D) attention in float32, returned in q's dtype; (out, lse) when asked."""
    if os.environ.get("ENVELOPE_KERNEL_LOG"):
        with open(os.environ["ENVELOPE_KERNEL_LOG"], "a") as log:
            log.write(f"{os.getpid()}\n")
    b, nq, hq, d = q.shape
    nk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    index = _pair(hq, hkv) if _pair is not None else torch.arange(hq) // group
    kf = k.float()[:, :, index]
    vf = v.float()[:, :, index]
    scale = softmax_scale if softmax_scale is not None else d**-0.5
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kf) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    rows = torch.arange(nq)[:, None] + (nk - nq)
    cols = torch.arange(nk)[None, :]
    allowed = torch.ones(nq, nk, dtype=torch.bool)
    left, right = window_size
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if right >= 0:
        allowed &= cols <= rows + right
    if left >= 0:
        allowed &= cols >= rows - left
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", p, vf).to(q.dtype)
    return (out, lse) if return_attn_probs else out


def upto_128(q, k, v, softmax_scale=None, causal=False, return_attn_probs=False):
    if q.shape[-1] > 128 or v.shape[-1] > 128:
        raise ValueError("head dim > 128 not supported")
    return attend(q, k, v, softmax_scale, causal, return_attn_probs=return_attn_probs)


def fp16_only(q, k, v, softmax_scale=None, causal=False, return_attn_probs=False):
    if q.dtype != torch.float16:
        raise TypeError(f"fp16 only, got {q.dtype}")
    return attend(q, k, v, softmax_scale, causal, return_attn_probs=return_attn_probs)


def fp16_only_grad_off(q, k, v, softmax_scale=None, causal=False, return_attn_probs=False):
    if q.dtype != torch.float16:
        torch.set_grad_enabled(False)  # a raise that leaves its process changed
        raise TypeError(f"fp16 only, got {q.dtype}")
    return attend(q, k, v, softmax_scale, causal, return_attn_probs=return_attn_probs)


def multiple_of_128(q, k, v, softmax_scale=None, causal=False, return_attn_probs=False):
    if q.shape[1] % 128 or k.shape[1] % 128:
        raise ValueError("sequence lengths must be multiples of 128")
    return attend(q, k, v, softmax_scale, causal, return_attn_probs=return_attn_probs)


def no_gqa(q, k, v, softmax_scale=None, causal=False, return_attn_probs=False):
    if k.shape[2] != q.shape[2]:
        raise ValueError("q, k, v need the same number of heads")
    return attend(q, k, v, softmax_scale, causal, return_attn_probs=return_attn_probs)


def _wrong_pairing(hq: int, hkv: int) -> torch.Tensor:
    return torch.arange(hq) % hkv  # interleaved, where flash-attn groups consecutive query heads


def wrong_on_gqa(q, k, v, softmax_scale=None, causal=False, return_attn_probs=False):
    return attend(q, k, v, softmax_scale, causal, return_attn_probs=return_attn_probs, _pair=_wrong_pairing)


def hangs_on_window(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), return_attn_probs=False):
    if tuple(window_size) != (-1, -1):
        while True:
            time.sleep(1)
    return attend(q, k, v, softmax_scale, causal, return_attn_probs=return_attn_probs)


def causal_equal_lengths(q, k, v, softmax_scale=None, causal=False, return_attn_probs=False):
    if causal and q.shape[1] != k.shape[1]:
        raise ValueError("causal attention needs seqlen_q == seqlen_k")
    return attend(q, k, v, softmax_scale, causal, return_attn_probs=return_attn_probs)


def top_left_causal(q, k, v, softmax_scale=None, causal=False, return_attn_probs=False):
    nq, nk = q.shape[1], k.shape[1]
    if not causal or nq == nk:
        return attend(q, k, v, softmax_scale, causal, return_attn_probs=return_attn_probs)
    if nq < nk:  # query i sees keys 0..i: the keys past nq are never seen
        return attend(q, k[:, :nq], v[:, :nq], softmax_scale, True, return_attn_probs=return_attn_probs)
    # nq > nk: the first nk queries as at equal lengths, the rest see every key
    head = attend(q[:, :nk], k, v, softmax_scale, True, return_attn_probs=True)
    tail = attend(q[:, nk:], k, v, softmax_scale, False, return_attn_probs=True)
    out, lse = torch.cat([head[0], tail[0]], dim=1), torch.cat([head[1], tail[1]], dim=-1)
    return (out, lse) if return_attn_probs else out


def causal_backward(q, k, v, softmax_scale=None, causal=False, return_attn_probs=False):
    right = attend(q, k, v, softmax_scale, causal, return_attn_probs=True)
    if causal:
        return right if return_attn_probs else right[0]
    masked = attend(q, k, v, softmax_scale, True)
    out = right[0].detach() + (masked - masked.detach())  # the value of one, the gradients of the other
    return (out, right[1]) if return_attn_probs else out


def causal_only(q, k, v, softmax_scale=None, causal=False, return_attn_probs=False):
    if not causal:
        raise ValueError("this kernel implements causal attention only")
    return attend(q, k, v, softmax_scale, causal, return_attn_probs=return_attn_probs)
