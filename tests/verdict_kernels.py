"""Two user kernels for the check's end-to-end tests (`--kernel tests.verdict_kernels:NAME`).

Both wrap torch's scaled_dot_product_attention in the flash_attn_func convention (q, k, v as
(batch, seqlen, heads, head_dim)); `scale_off_by_5pct` is the same kernel with the softmax scale
5% too large, the kind of slip a kernel patch makes. Causal here is SDPA's top-left alignment, so
the tests use square (seqlen_q == seqlen_k) cases, where it equals flash-attn's bottom-right.
"""

from __future__ import annotations

import torch.nn.functional as F


def _sdpa(q, k, v, scale, causal):
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(qt, kt, vt, scale=scale, is_causal=causal, enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)


def sdpa_ok(q, k, v, softmax_scale=None, causal=False):
    return _sdpa(q, k, v, softmax_scale, causal)


def scale_off_by_5pct(q, k, v, softmax_scale=None, causal=False):
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    return _sdpa(q, k, v, scale * 1.05, causal)
